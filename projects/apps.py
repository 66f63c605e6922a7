from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    name = "projects"

    def ready(self) -> None:
        from projects import signals  # noqa: F401  (connects the receivers)
