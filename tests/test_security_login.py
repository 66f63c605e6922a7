"""Password guessing is throttled (django-axes) on /login/ and /admin/login/.

Past HERMESWEB_LOGIN_FAILURE_LIMIT failures for one username from one address, or
HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT from one address whatever the names, a sign-in is refused
with 429 even with the right password, until the cool-off ends. Five failures for made-up names
from 127.0.0.1 used to lock out every real user behind that address. Sessions already signed in,
`force_login`, `Client.login` and API tokens are never throttled.
"""

from __future__ import annotations

from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client

from tests import factories
from tests.conftest import token_client

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"  # tests/factories.py
LOGIN_PAGES = ["/login/", "/admin/login/"]


def sign_in(page: str, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return Client(REMOTE_ADDR=address).post(page, {"username": username, "password": password})


def fail(page: str, username: str, times: int, address: str = "10.0.0.1") -> list[int]:
    return [sign_in(page, username, "wrong", address).status_code for _ in range(times)]


@pytest.fixture
def staff(db: None) -> Any:
    return factories.UserFactory(username="grace", is_staff=True, is_superuser=True)


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_the_right_password_works_after_failures_below_the_limit(page: str, staff: Any) -> None:
    assert set(fail(page, "grace", settings.AXES_FAILURE_LIMIT - 1)) == {200}  # the form, with its error

    response = sign_in(page, "grace", PASSWORD)

    assert response.status_code == 302
    # A success clears the count: the next failures start again from zero.
    assert not AccessAttempt.objects.filter(username="grace").exists()


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_failures_for_one_username_lock_it_out_at_that_address(page: str, staff: Any) -> None:
    answers = fail(page, "grace", settings.AXES_FAILURE_LIMIT, address="10.0.1.1")
    assert answers == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]

    response = sign_in(page, "grace", PASSWORD, address="10.0.1.1")

    assert response.status_code == 429
    assert b"too many" in response.content.lower()
    # Someone failing on purpose from elsewhere does not lock the user out where they are.
    assert sign_in(page, "grace", PASSWORD, address="10.0.2.1").status_code == 302


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_failures_for_made_up_names_do_not_lock_out_a_real_user_behind_the_same_address(
    page: str, staff: Any
) -> None:
    # Any local process signs in from 127.0.0.1, as the users of the embedded default do.
    guesses = [
        n for name in range(10) for n in fail(page, f"nobody{name}", settings.AXES_FAILURE_LIMIT, "127.0.0.1")
    ]
    assert guesses.count(429) == 10  # each made-up name is locked at that address

    assert sign_in(page, "grace", PASSWORD, address="127.0.0.1").status_code == 302


def test_the_address_limit_is_much_higher_than_the_username_limit() -> None:
    assert settings.HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT >= 20 * settings.AXES_FAILURE_LIMIT


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_an_address_is_locked_out_at_its_own_limit_whatever_usernames_it_tries(
    page: str, staff: Any, settings: Any
) -> None:
    settings.HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT = 12
    for n in range(11):
        fail(page, f"guess{n}", 1, address="10.0.3.3")
    assert sign_in(page, "grace", PASSWORD, address="10.0.3.3").status_code == 302
    # A success clears that username's count there, not the address's: one more failure locks it.
    assert fail(page, "guess11", 1, address="10.0.3.3") == [429]

    assert sign_in(page, "grace", PASSWORD, address="10.0.3.3").status_code == 429
    # The same user from another address is not locked by that address's failures.
    assert sign_in(page, "grace", PASSWORD, address="10.0.3.4").status_code == 302


def test_the_lockout_is_listed_in_the_admin(staff: Any) -> None:
    fail("/login/", "ada", settings.AXES_FAILURE_LIMIT, address="10.0.4.4")
    admin = Client()
    admin.force_login(staff)

    page = admin.get("/admin/axes/accessattempt/")

    assert page.status_code == 200
    assert b"10.0.4.4" in page.content
    assert AccessAttempt.objects.get(username="ada").failures_since_start == settings.AXES_FAILURE_LIMIT


def test_signed_in_sessions_tokens_and_test_logins_are_not_throttled(user: Any) -> None:
    fail("/login/", "ada", settings.AXES_FAILURE_LIMIT, address="127.0.0.1")
    assert sign_in("/login/", "ada", PASSWORD, address="127.0.0.1").status_code == 429

    forced = Client()
    forced.force_login(user)
    assert forced.get("/api/projects").status_code == 200
    assert token_client(user).get("/api/projects").status_code == 200
    # authenticate() without a request is the operator's own code, never a network guess.
    client = Client()
    assert client.login(username="ada", password=PASSWORD)
    assert client.get("/api/projects").status_code == 200
