"""The admin is the operators' diagnostics console (docs/operations.md).

Only staff reach it (Django's admin site requires `is_staff`). Every staff
member may look at everything here — the admin is the one place where staff
see other users' objects; the API, the pages and the socket show staff only
their own (docs/security.md, "Between users"). Acting needs Django's model
permissions: changing a row, and every action (`permissions=` on
`@admin.action`; superusers hold them all). The journal is never editable.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from hermesweb.models import ApiToken
from runs.usage import describe, user_usage

admin.site.site_header = "hermesweb diagnostics"
admin.site.site_title = "hermesweb diagnostics"
admin.site.index_title = "Runs, runners, sessions and their journal"


def is_staff(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff)


class StaffViewMixin:
    """Any active staff member may view these models, without per-model view permissions."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_staff(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_staff(request)


class ReadOnlyMixin(StaffViewMixin):
    """Rows only the system writes (journal, controls, runners, jobs): view, never add or edit."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "created_at"]
    search_fields = ["prefix", "name", "user__username"]
    list_select_related = ["user"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]
    fields = ["user", "name", "prefix", "digest", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # The raw value can be shown only once, at creation: tokens come from `manage.py create_token`.
        return False

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")


class UserWithTokensAdmin(UserAdmin):
    """Django's user admin, with revoking every API token of the selected users."""

    actions = ["revoke_api_tokens"]
    list_display = [*UserAdmin.list_display, "usage_total"]

    @admin.display(description="Usage (all sessions)")
    def usage_total(self, obj: Any) -> str:
        # Summed from the runs' recorded usage (runs/usage.py): a page of users, a query each.
        return describe(user_usage(obj.pk))

    @admin.action(description="Revoke all API tokens of selected users", permissions=["revoke_tokens"])
    def revoke_api_tokens(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        in_force = ApiToken.objects.filter(user__in=queryset.values("pk"), revoked_at__isnull=True)
        count = in_force.update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")

    def has_revoke_tokens_permission(self, request: HttpRequest) -> bool:
        # The same permission as revoking tokens one by one on the tokens' own page.
        return bool(request.user.has_perm("hermesweb.change_apitoken"))


_user_model = get_user_model()
if admin.site.is_registered(_user_model):
    admin.site.unregister(_user_model)
admin.site.register(_user_model, UserWithTokensAdmin)
