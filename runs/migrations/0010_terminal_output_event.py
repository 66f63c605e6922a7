# ACP terminals' output journaled as `terminal.output` deltas (runs/runner/terminals.py).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_run_source_workspace"),
    ]

    operations = [
        migrations.AlterField(
            model_name="journalevent",
            name="type",
            field=models.CharField(
                choices=[
                    ("run.started", "Run Started"),
                    ("status", "Status"),
                    ("token.delta", "Token Delta"),
                    ("reasoning.delta", "Reasoning Delta"),
                    ("reasoning.done", "Reasoning Done"),
                    ("progress", "Progress"),
                    ("tool.started", "Tool Started"),
                    ("tool.updated", "Tool Updated"),
                    ("tool.done", "Tool Done"),
                    ("plan.updated", "Plan Updated"),
                    ("approval.requested", "Approval Requested"),
                    ("approval.resolved", "Approval Resolved"),
                    ("clarify.requested", "Clarify Requested"),
                    ("clarify.resolved", "Clarify Resolved"),
                    ("steer.delivered", "Steer Delivered"),
                    ("title.updated", "Title Updated"),
                    ("usage.updated", "Usage Updated"),
                    ("usage.final", "Usage Final"),
                    ("terminal.output", "Terminal Output"),
                    ("error", "Error"),
                    ("files.restored", "Files Restored"),
                    ("done", "Done"),
                ],
                max_length=30,
            ),
        ),
    ]
