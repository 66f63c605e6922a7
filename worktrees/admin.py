from django.contrib import admin

from worktrees.models import Worktree, WorktreeMerge


@admin.register(Worktree)
class WorktreeAdmin(admin.ModelAdmin):
    list_display = ("session", "branch", "base", "state", "created_at")
    list_filter = ("state",)
    search_fields = ("branch", "path")
    readonly_fields = ("session", "base_commit", "path", "repository", "created_at", "updated_at")


@admin.register(WorktreeMerge)
class WorktreeMergeAdmin(admin.ModelAdmin):
    list_display = ("worktree", "strategy", "commit", "created_at")
    readonly_fields = ("worktree", "client_id", "strategy", "commit", "created_at")
