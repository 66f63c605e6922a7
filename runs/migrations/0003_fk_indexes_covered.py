import django.db.models.deletion
from django.db import migrations, models

from hermesweb.migration_ops import drop_covered_fk_index


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0001_initial"),
        ("runs", "0002_agentjob_import_source"),
    ]

    operations = [
        drop_covered_fk_index(
            "control",
            "run",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="controls",
                to="runs.run",
            ),
            "runs_control",
            "runs_control_run_id_f6942530",
        ),
        drop_covered_fk_index(
            "journalevent",
            "run",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="runs.run",
            ),
            "runs_journalevent",
            "runs_journalevent_run_id_b646f6cc",
        ),
        drop_covered_fk_index(
            "run",
            "session",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="runs",
                to="projects.session",
            ),
            "runs_run",
            "runs_run_session_id_00312722",
        ),
    ]
