from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self) -> None:
        # Connects the receiver that removes an attachment's file with its row.
        from runs import attachments  # noqa: F401
