import django.db.models.deletion
from django.db import migrations, models

from hermesweb.migration_ops import drop_covered_fk_index


class Migration(migrations.Migration):
    dependencies = [
        ("intents", "0001_initial"),
        ("projects", "0001_initial"),
    ]

    operations = [
        drop_covered_fk_index(
            "pendingintent",
            "session",
            models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="intents",
                to="projects.session",
            ),
            "intents_pendingintent",
            "intents_pendingintent_session_id_c577ffaf",
        ),
    ]
