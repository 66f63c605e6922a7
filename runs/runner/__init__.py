"""The runner process and everything only it runs (`python manage.py runner`).

Design note: docs/runner.md ("The package": one line per module, and the narrow
interfaces executions and the job loop see the runner through). It claims runs and
agent jobs, owns the agent processes (ACP over stdio), translates ACP into journal
events through its writer and applies controls. It reaches the rest of the product
only through domain actions (runs.journal, runs.turns, runs.discovery,
intents.services), never through views, the API or socket consumers.
"""
