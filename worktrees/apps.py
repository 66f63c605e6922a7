from django.apps import AppConfig


class WorktreesConfig(AppConfig):
    name = "worktrees"
    verbose_name = "Worktrees (a session's own git worktree and branch)"

    def ready(self) -> None:
        from worktrees import signals  # noqa: F401  (connects the receivers)
