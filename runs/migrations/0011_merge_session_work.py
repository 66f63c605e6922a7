# Three changes made side by side in one session (warm-up requests, agent reports,
# terminal output events): this only joins their branches of the graph.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_warm_request"),
        ("runs", "0010_agent_report"),
        ("runs", "0010_terminal_output_event"),
    ]

    operations = []
