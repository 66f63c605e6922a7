# Project.status: an archived project is out of the default lists and its sessions take no new messages.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0002_fk_indexes_covered"),
    ]

    operations = [
        migrations.AddField(
            model_name="project",
            name="status",
            field=models.CharField(
                choices=[("active", "Active"), ("archived", "Archived")], default="active", max_length=20
            ),
        ),
    ]
