# Session: the modes and models the agent reported, and where a forked session came from.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0003_project_status"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="available_modes",
            field=models.JSONField(
                blank=True, default=list, help_text="Modes the agent reported: [{id, name, description}]."
            ),
        ),
        migrations.AddField(
            model_name="session",
            name="available_models",
            field=models.JSONField(blank=True, default=list, help_text="Models the agent reported: [{id, name}]."),
        ),
        migrations.AddField(
            model_name="session",
            name="forked_from",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="forks",
                to="projects.session",
            ),
        ),
        migrations.AddField(
            model_name="session",
            name="fork_agent_session_id",
            field=models.CharField(
                blank=True,
                help_text="The parent's ACP sessionId to fork (session/fork) when this session first runs.",
                max_length=200,
            ),
        ),
    ]
