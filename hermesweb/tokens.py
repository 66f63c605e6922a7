"""Personal API tokens end with the credentials they were issued under (docs/security.md).

A new password (`set_password`, or an unusable one) and a deactivation revoke every token of
the user, as they end the user's sign-ins: reactivating the account brings none back. The user
revokes all their tokens with `POST /api/tokens/revoke-all`; staff with the users' admin action.
Receivers are wired in hermesweb.apps.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema

from hermesweb.models import ApiToken

# The credentials a user row was loaded with, kept apart from hermesweb.auth's own copy.
_LOADED = "_hermesweb_token_credentials"


def _credentials(user: Any) -> tuple[Any, Any]:
    # From __dict__: a deferred field must not cost a query per user loaded.
    fields = user.__dict__
    return fields.get("password"), fields.get("is_active")


def remember_credentials(sender: Any, instance: Any, **kwargs: Any) -> None:
    instance.__dict__[_LOADED] = _credentials(instance)


def revoke_on_credentials_change(
    sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    """post_save of the user model: a new password or a deactivation revokes the user's tokens.

    A hash Django rewrites on sign-in (a stronger hasher: `check_password`'s setter) is the same
    password, not a new one: only `set_password` leaves the raw password on the instance until
    the save ends, and an unusable password is a new one too.
    """
    before = instance.__dict__.get(_LOADED)
    now = _credentials(instance)
    instance.__dict__[_LOADED] = now
    if created or raw:
        return
    new_password = getattr(instance, "_password", None) is not None or (
        before is not None and before[0] != now[0] and not instance.has_usable_password()
    )
    deactivated = before is not None and before[1] and now[1] is False
    if new_password or deactivated:
        ApiToken.revoke_all(instance.pk)


# ---------------------------------------------------------------- API

router = Router()


class TokensRevokedOut(Schema):
    revoked: int = Field(description="How many tokens were in force and are revoked now.")


@router.post("/tokens/revoke-all", response=TokensRevokedOut, tags=["tokens"])
def revoke_all_tokens(request: HttpRequest) -> TokensRevokedOut:
    """Revoke every personal API token of yours, the one this request carries included.

    Signed-in browsers stay signed in; a token caller's next request answers 401.
    """
    return TokensRevokedOut(revoked=ApiToken.revoke_all(request.auth.pk))  # type: ignore[attr-defined]
