# Files rewound or restored, journaled in a workspace run of its own (docs/workspace.md).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_run_network_refused"),
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
                    ("error", "Error"),
                    ("files.restored", "Files Restored"),
                    ("done", "Done"),
                ],
                max_length=30,
            ),
        ),
        migrations.AlterField(
            model_name="run",
            name="source",
            field=models.CharField(
                choices=[
                    ("composer", "Composer"),
                    ("workflow", "Workflow"),
                    ("queue", "Queue"),
                    ("stop_and_send", "Stop And Send"),
                    ("leftover_steer", "Leftover Steer"),
                    ("import", "Import"),
                    ("workspace", "Workspace"),
                ],
                default="composer",
                max_length=20,
            ),
        ),
    ]
