"""The API's object kinds, by the path segment that names their collection (`/api/runs/{id}`)."""

from __future__ import annotations

COLLECTIONS = {
    "projects": "project",
    "workflows": "workflow",
    "sessions": "session",
    "runs": "run",
    "intents": "intent",
    "jobs": "job",
    "attachments": "attachment",
    "triggers": "trigger",
    "checkpoints": "checkpoint",
}
