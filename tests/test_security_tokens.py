"""API tokens end with the credentials they were issued under (hermesweb/tokens.py, docs/security.md):
a new password or a deactivation revokes them for good, and the user (API) and staff (admin) can
revoke all of a user's tokens at once."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission
from django.test import Client

from hermesweb.models import ApiToken
from tests import factories

pytestmark = pytest.mark.django_db

USERS = "/admin/auth/user/"


def token_works(raw: str) -> bool:
    response = Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/projects")
    assert response.status_code in (200, 401), response.content
    return response.status_code == 200


def issue(user: Any) -> str:
    return ApiToken.issue(user, name="script")[1]


def test_a_deactivated_users_tokens_stay_revoked_when_the_account_comes_back(user: Any) -> None:
    raw = issue(user)
    assert token_works(raw)

    user.is_active = False
    user.save()
    assert not token_works(raw)
    user.is_active = True
    user.save()

    assert not token_works(raw)
    assert ApiToken.objects.get(user=user).revoked_at is not None


def test_a_password_change_revokes_every_token_of_the_user_and_only_theirs(
    user: Any, other_user: Any
) -> None:
    mine, also_mine, theirs = issue(user), issue(user), issue(other_user)

    user.set_password("a whole new password")
    user.save()

    assert (token_works(mine), token_works(also_mine), token_works(theirs)) == (False, False, True)


def test_an_unusable_password_revokes_the_tokens(user: Any) -> None:
    raw = issue(user)

    user.set_unusable_password()
    user.save()

    assert not token_works(raw)


def test_a_password_rehashed_on_sign_in_is_the_same_password_and_keeps_the_tokens(user: Any) -> None:
    # A salt shorter than the hasher wants today: checking the password rewrites the hash.
    weak = make_password("old secret", salt="ab", hasher="md5")
    get_user_model().objects.filter(pk=user.pk).update(password=weak)
    raw = issue(user)
    stored = get_user_model().objects.get(pk=user.pk)

    assert stored.check_password("old secret")
    stored.refresh_from_db()
    assert stored.password != weak  # rewritten, and saved with update_fields=["password"]
    assert token_works(raw)
    # …while a new password, saved the same way, revokes them.
    stored.set_password("new secret")
    stored.save(update_fields=["password"])
    assert not token_works(raw)


def test_revoke_all_through_the_api_ends_every_token_of_the_caller_and_no_one_elses(
    user: Any, other_user: Any, api: Client
) -> None:
    mine, also_mine, theirs = issue(user), issue(user), issue(other_user)

    response = api.post("/api/tokens/revoke-all")

    assert response.status_code == 200, response.content
    assert response.json() == {"revoked": 2}
    assert (token_works(mine), token_works(also_mine), token_works(theirs)) == (False, False, True)
    assert api.get("/api/projects").status_code == 200  # the browser's sign-in stays


def test_revoke_all_with_a_token_revokes_that_token_too(user: Any) -> None:
    raw, other = issue(user), issue(user)
    client = Client(headers={"Authorization": f"Bearer {raw}"})

    assert client.post("/api/tokens/revoke-all").json() == {"revoked": 2}
    response = client.post("/api/tokens/revoke-all")

    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"
    assert not token_works(other)


def revoke_all_of(console: Client, user: Any) -> Any:
    return console.post(
        USERS,
        {"action": "revoke_api_tokens", helpers.ACTION_CHECKBOX_NAME: [user.pk], "index": 0},
        follow=True,
    )


def test_only_staff_with_the_token_permission_revoke_all_tokens_of_the_users_they_select(
    staff_user: Any, user: Any, other_user: Any
) -> None:
    viewer = factories.UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_user", content_type__app_label="auth"))
    staff_user.user_permissions.add(
        Permission.objects.get(codename="change_apitoken"),
        Permission.objects.get(codename="view_user", content_type__app_label="auth"),
    )
    mine, theirs = issue(user), issue(other_user)
    console, onlooker = Client(), Client()
    console.force_login(staff_user)
    onlooker.force_login(viewer)

    assert b"revoke_api_tokens" not in onlooker.get(USERS).content
    revoke_all_of(onlooker, user)
    assert token_works(mine)

    assert b"revoke_api_tokens" in console.get(USERS).content
    assert revoke_all_of(console, user).status_code == 200
    assert (token_works(mine), token_works(theirs)) == (False, True)
