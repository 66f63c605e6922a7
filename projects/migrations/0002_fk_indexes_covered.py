import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from hermesweb.migration_ops import drop_covered_fk_index


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        drop_covered_fk_index(
            "project",
            "owner",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="projects",
                to=settings.AUTH_USER_MODEL,
            ),
            "projects_project",
            "projects_project_owner_id_b940de39",
        ),
        drop_covered_fk_index(
            "session",
            "project",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="sessions",
                to="projects.project",
            ),
            "projects_session",
            "projects_session_project_id_53b93933",
        ),
    ]
