"""Triggers on a workflow (issue 42): create, list, change, delete; schedules checked and planned.

docs/automations.md. Cron times are computed in the trigger's zone by cronsim; a daylight-saving
change moves them in UTC and neither skips nor doubles a day.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from automations import schedule
from automations.models import Trigger, hash_secret
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def workflow(project: Any) -> Any:
    return factories.WorkflowFactory(project=project, prompt_template="Check the dependencies.")


def post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, body, content_type="application/json")


def test_it_creates_a_cron_schedule_with_its_next_time_in_the_zone(api: Client, workflow: Any) -> None:
    response = post(
        api,
        f"/api/workflows/{workflow.pk}/triggers",
        {"kind": "schedule", "cron": "0 7 * * 1-5", "timezone": "Europe/Berlin"},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["kind"] == "schedule" and body["enabled"] is True and body["url"] is None
    planned = datetime.fromisoformat(body["next_fire_at"])
    local = planned.astimezone(schedule.zone("Europe/Berlin"))
    assert (local.hour, local.minute) == (7, 0) and local.weekday() < 5
    assert planned > datetime.now(UTC)

    listed = api.get(f"/api/workflows/{workflow.pk}/triggers").json()
    assert [t["id"] for t in listed] == [body["id"]]


def test_it_creates_a_one_shot_schedule(api: Client, workflow: Any) -> None:
    at = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
    response = post(api, f"/api/workflows/{workflow.pk}/triggers", {"kind": "schedule", "at": at.isoformat()})
    assert response.status_code == 201, response.content
    assert datetime.fromisoformat(response.json()["next_fire_at"]) == at


def test_a_webhook_shows_its_url_once_and_keeps_only_its_hash(api: Client, workflow: Any) -> None:
    response = post(api, f"/api/workflows/{workflow.pk}/triggers", {"kind": "webhook"})
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body["url"].rsplit("/", 1)[-1]
    assert body["url"].endswith(f"/api/hooks/{secret}") and len(secret) > 40
    trigger = Trigger.objects.get(pk=body["id"])
    assert trigger.secret_digest == hash_secret(secret)
    assert secret not in str(Trigger.objects.filter(pk=trigger.pk).values().get())
    assert api.get(f"/api/triggers/{trigger.pk}").json()["url"] is None
    assert all(t["url"] is None for t in api.get(f"/api/workflows/{workflow.pk}/triggers").json())

    rotated = api.post(f"/api/triggers/{trigger.pk}/secret")
    assert rotated.status_code == 200
    new_secret = rotated.json()["url"].rsplit("/", 1)[-1]
    assert new_secret != secret
    trigger.refresh_from_db()
    assert trigger.secret_digest == hash_secret(new_secret)


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"kind": "schedule", "cron": "0 7 * *"}, "invalid_schedule", "cron"),
        ({"kind": "schedule", "cron": "61 7 * * *"}, "invalid_schedule", "cron"),
        ({"kind": "schedule", "cron": "0 0 30 2 *"}, "invalid_schedule", "cron"),
        ({"kind": "schedule", "cron": "0 0 0 7 * *"}, "invalid_schedule", "cron"),  # six fields
        (
            {"kind": "schedule", "cron": "0 7 * * *", "timezone": "Mars/Olympus"},
            "invalid_timezone",
            "timezone",
        ),
        (
            {"kind": "schedule", "cron": "0 7 * * *", "timezone": "../../etc/passwd"},
            "invalid_timezone",
            "timezone",
        ),
        ({"kind": "schedule"}, "invalid_schedule", "cron"),
        ({"kind": "schedule", "cron": "0 7 * * *", "at": "2030-01-01T00:00:00Z"}, "invalid_schedule", "cron"),
        ({"kind": "schedule", "at": "2001-01-01T00:00:00Z"}, "invalid_schedule", "at"),
        ({"kind": "schedule", "at": "2030-01-01T00:00:00"}, "invalid_schedule", "at"),
        ({"kind": "webhook", "cron": "0 7 * * *"}, "invalid_schedule", "cron"),
    ],
)
def test_a_bad_schedule_is_a_422_with_the_reason(
    api: Client, workflow: Any, body: dict[str, Any], code: str, field: str
) -> None:
    response = post(api, f"/api/workflows/{workflow.pk}/triggers", body)
    assert response.status_code == 422, response.content
    error = response.json()
    assert error["code"] == code and error["message"]
    assert error["details"][0]["field"] == field
    assert not Trigger.objects.exists()


def test_patch_changes_the_schedule_and_disabling_plans_nothing(api: Client, workflow: Any) -> None:
    created = post(api, f"/api/workflows/{workflow.pk}/triggers", {"kind": "schedule", "cron": "0 7 * * *"})
    url = f"/api/triggers/{created.json()['id']}"

    changed = api.patch(
        url, {"cron": "30 6 * * *", "timezone": "Asia/Tokyo"}, content_type="application/json"
    )
    assert changed.status_code == 200, changed.content
    local = datetime.fromisoformat(changed.json()["next_fire_at"]).astimezone(schedule.zone("Asia/Tokyo"))
    assert (local.hour, local.minute) == (6, 30)

    off = api.patch(url, {"enabled": False}, content_type="application/json").json()
    assert off["enabled"] is False and off["next_fire_at"] is None
    on = api.patch(url, {"enabled": True}, content_type="application/json").json()
    assert on["next_fire_at"] is not None

    bad = api.patch(url, {"timezone": "Nowhere/Else"}, content_type="application/json")
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_timezone"

    assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404


def test_only_the_owner_sees_or_changes_a_trigger(api: Client, workflow: Any, other_user: Any) -> None:
    created = post(api, f"/api/workflows/{workflow.pk}/triggers", {"kind": "webhook"}).json()
    mallory = Client()
    mallory.force_login(other_user)
    url = f"/api/triggers/{created['id']}"
    assert mallory.get(f"/api/workflows/{workflow.pk}/triggers").status_code == 404
    assert post(mallory, f"/api/workflows/{workflow.pk}/triggers", {"kind": "webhook"}).status_code == 404
    assert mallory.patch(url, {"enabled": False}, content_type="application/json").status_code == 404
    assert mallory.post(f"{url}/secret").status_code == 404
    assert mallory.delete(url).status_code == 404
    assert mallory.get(f"/api/workflows/{workflow.pk}/firings").status_code == 404
    assert Trigger.objects.get(pk=created["id"]).enabled


def test_a_fixed_session_must_be_of_the_workflows_project(api: Client, workflow: Any, user: Any) -> None:
    elsewhere = factories.SessionFactory(project=factories.ProjectFactory(owner=user))
    response = post(
        api,
        f"/api/workflows/{workflow.pk}/triggers",
        {"kind": "webhook", "session_id": elsewhere.pk},
    )
    assert response.status_code == 422 and response.json()["code"] == "wrong_project"


# ---------------------------------------------------------------- cron across daylight saving


def test_cron_next_times_across_the_spring_forward_gap() -> None:
    # Berlin, 2027-03-28: 02:00 → 03:00. Daily 02:30 does not exist that day; cronsim (as cron)
    # runs it once at the gap's end, then at 02:30 again.
    start = datetime(2027, 3, 26, 12, 0, tzinfo=UTC)
    times = [t for _, t in zip(range(4), schedule.times("30 2 * * *", "Europe/Berlin", start), strict=False)]
    local = [t.astimezone(schedule.zone("Europe/Berlin")) for t in times]
    assert [(t.day, t.hour, t.minute) for t in local] == [(27, 2, 30), (28, 3, 0), (29, 2, 30), (30, 2, 30)]
    # In UTC the offset moves by an hour across the change: +01:00 before, +02:00 after.
    assert [t.hour for t in times] == [1, 1, 0, 0]


def test_cron_next_times_across_the_fall_back_repeat() -> None:
    # Berlin, 2027-10-31: 03:00 → 02:00. Daily 02:30 happens twice in local time; it fires once.
    start = datetime(2027, 10, 29, 12, 0, tzinfo=UTC)
    times = list(zip(range(3), schedule.times("30 2 * * *", "Europe/Berlin", start), strict=False))
    days = [t.astimezone(schedule.zone("Europe/Berlin")).day for _, t in times]
    assert days == [30, 31, 1]
    assert len({t for _, t in times}) == 3


def test_an_hourly_cron_keeps_one_firing_an_hour_across_the_change() -> None:
    # UTC hours are what elapses: around the repeat, 0 * * * * fires every real hour, no double.
    start = datetime(2027, 10, 30, 22, 30, tzinfo=UTC)
    times = [t for _, t in zip(range(5), schedule.times("0 * * * *", "Europe/Berlin", start), strict=False)]
    gaps = {(b - a) for a, b in itertools.pairwise(times)}
    assert gaps == {timedelta(hours=1)}


def test_next_after_is_strictly_after() -> None:
    at = datetime(2027, 1, 4, 7, 0, tzinfo=UTC)  # a Monday, 07:00 UTC
    assert schedule.next_after("0 7 * * 1-5", "UTC", at) == at + timedelta(days=1)
    assert schedule.next_after("0 7 * * 1-5", "UTC", at - timedelta(seconds=1)) == at


def test_the_admin_lists_triggers_and_firings(workflow: Any) -> None:
    from automations import services
    from automations.models import Firing

    trigger = services.do_create_trigger(workflow, kind="schedule", cron="0 7 * * *").trigger
    Firing.objects.create(trigger=trigger, planned_at=datetime.now(UTC), outcome="failed", reason="x: y")
    staff = Client()
    staff.force_login(factories.UserFactory(username="root", is_staff=True, is_superuser=True))
    for url in (
        "/admin/automations/trigger/",
        f"/admin/automations/trigger/{trigger.pk}/change/",
        "/admin/automations/firing/",
    ):
        response = staff.get(url)
        assert response.status_code == 200, url
    assert trigger.secret_digest is None
