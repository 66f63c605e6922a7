# Warm agents (issue 43): a session's warm-up hint, taken by one runner.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0004_session_modes_models_fork"),
        ("runs", "0008_run_network_refused"),
    ]

    operations = [
        migrations.CreateModel(
            name="WarmRequest",
            fields=[
                (
                    "session",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="projects.session",
                    ),
                ),
                ("requested_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
        ),
    ]
