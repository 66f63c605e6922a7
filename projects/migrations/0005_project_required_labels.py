"""A project may require runner labels (runs.placement)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("projects", "0004_session_modes_models_fork")]

    operations = [
        migrations.AddField(
            model_name="project", name="required_labels", field=models.JSONField(blank=True, default=list)
        ),
    ]
