"""A runner advertises its labels and the roots it serves (runs.placement)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_run_network_refused")]

    operations = [
        migrations.AddField(
            model_name="runner", name="labels", field=models.JSONField(blank=True, default=list)
        ),
        migrations.AddField(
            model_name="runner", name="roots", field=models.JSONField(blank=True, default=list)
        ),
    ]
