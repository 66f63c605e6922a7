from django.apps import AppConfig


class WorkspaceConfig(AppConfig):
    name = "workspace"
    verbose_name = "Workspace (checkpoints, changes, rewind, files)"

    def ready(self) -> None:
        from workspace import signals  # noqa: F401  (connects the receiver)
