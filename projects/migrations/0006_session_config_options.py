# Issue 44: the agent's session config options and the user's choices among them.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0005_project_required_labels"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="config",
            field=models.JSONField(blank=True, default=dict, help_text="Chosen config values by option id."),
        ),
        migrations.AddField(
            model_name="session",
            name="config_options",
            field=models.JSONField(blank=True, default=list, help_text="The agent's config options."),
        ),
    ]
