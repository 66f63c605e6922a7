# Issue 44: what each agent's last initialize reported (GET /api/agents).

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_runner_placement"),
    ]

    operations = [
        migrations.CreateModel(
            name="AgentReport",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent", models.CharField(max_length=100, unique=True)),
                ("agent_info", models.JSONField(blank=True, default=dict)),
                ("capabilities", models.JSONField(blank=True, default=dict)),
                ("runner_id", models.CharField(blank=True, max_length=100)),
                ("reported_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
    ]
