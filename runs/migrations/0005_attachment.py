"""Attachments: files uploaded to a session and sent to the agent with a message (docs/agents.md)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0001_initial"),
        ("runs", "0004_searchdocument"),
    ]

    operations = [
        migrations.CreateModel(
            name="Attachment",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                (
                    "mime_type",
                    models.CharField(help_text="Detected from the content, not the client.", max_length=100),
                ),
                ("size", models.PositiveBigIntegerField()),
                ("sha256", models.CharField(max_length=64)),
                ("path", models.CharField(help_text="Relative to the data directory.", max_length=500)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attachments",
                        to="projects.session",
                    ),
                ),
            ],
            options={"ordering": ["created_at", "id"]},
        ),
    ]
