"""Project paths: strictly inside an allowed root, clear of other users' projects, everywhere.

A root holds every user's projects, so a project on a root (or on another user's project)
gives its agent everyone's files. The same rules hold for the API, the admin form and the
function the runner calls before starting an agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Project
from projects.paths import PathRefused, validate_project_location
from tests.factories import ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"
REPO = Path(__file__).resolve().parent.parent


def create(client: Client, path: str | Path, name: str = "P") -> Any:
    return client.post("/api/projects", {"name": name, "path": str(path)}, content_type=JSON)


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def mallory(other_user: Any) -> Client:
    return signed_in(other_user)


def directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- roots


def test_an_allowed_root_itself_is_refused_as_a_project_path(api: Client, allowed_root: Path) -> None:
    response = create(api, allowed_root)

    assert response.status_code == 422
    assert response.json()["code"] == "path_is_root"
    assert not Project.objects.exists()


def test_a_directory_holding_another_allowed_root_is_refused(
    api: Client, allowed_root: Path, settings: Any
) -> None:
    inner_root = directory(allowed_root / "team" / "root")
    settings.HERMESWEB_ALLOWED_ROOTS = [allowed_root, inner_root]

    assert create(api, allowed_root / "team").json()["code"] == "path_is_root"
    assert create(api, inner_root).json()["code"] == "path_is_root"
    assert create(api, directory(inner_root / "mine")).status_code == 201


def test_outside_the_roots_a_missing_and_an_existing_directory_get_the_same_answer(
    api: Client, tmp_path: Path
) -> None:
    existing = directory(tmp_path / "outside")
    missing = tmp_path / "no-such-dir"

    answers = [create(api, path) for path in (existing, missing)]

    assert [a.status_code for a in answers] == [422, 422]
    assert [a.json()["code"] for a in answers] == ["path_outside_roots", "path_outside_roots"]
    messages = [
        a.json()["message"].replace(str(p), "X") for a, p in zip(answers, (existing, missing), strict=True)
    ]
    assert messages[0] == messages[1]


def test_inside_a_root_a_missing_directory_is_still_reported_as_missing(
    api: Client, allowed_root: Path
) -> None:
    assert create(api, allowed_root / "missing").json()["code"] == "path_not_directory"


@pytest.mark.parametrize("make", [lambda root: root / ("a" * 300), lambda root: root / "loop" / "x"])
def test_a_name_too_long_or_a_link_loop_is_a_422_not_a_500(
    api: Client, allowed_root: Path, make: Any
) -> None:
    (allowed_root / "loop").symlink_to(allowed_root / "loop")

    response = create(api, make(allowed_root))

    assert response.status_code == 422
    assert response.json()["code"].startswith("path_")


# ---------------------------------------------------------------- other users' projects


@pytest.mark.parametrize("where", ["same", "inside", "containing"])
def test_a_path_overlapping_another_users_project_is_taken(
    api: Client, mallory: Client, allowed_root: Path, where: str
) -> None:
    theirs = directory(allowed_root / "team" / "app")
    assert create(api, theirs).status_code == 201
    mine = {
        "same": theirs,
        "inside": directory(theirs / "src"),
        "containing": allowed_root / "team",
    }[where]

    response = create(mallory, mine)

    assert response.status_code == 409
    assert response.json()["code"] == "path_taken"
    assert Project.objects.count() == 1


def same_answers(answers: list[Any], probes: list[Path]) -> set[tuple[int, str, str]]:
    """Each answer's status, code and message with its own path taken out."""
    return {
        (a.status_code, a.json()["code"], a.json()["message"].replace(str(p), "X"))
        for a, p in zip(answers, probes, strict=True)
    }


def test_under_another_users_project_every_path_answers_the_same_409_existing_or_not(
    api: Client, mallory: Client, allowed_root: Path
) -> None:
    theirs = directory(allowed_root / "team" / "app")
    assert create(api, theirs).status_code == 201
    directory(theirs / "src" / "deep")
    (theirs / "notes.txt").write_text("")
    (theirs / "out").symlink_to("/etc")  # out of the roots
    (theirs / "loop").symlink_to(theirs / "loop")
    probes = [
        theirs / "src",
        theirs / "src" / "deep",
        theirs / "missing",
        theirs / "missing" / "deeper",
        theirs / "notes.txt",
        theirs / "out",
        theirs / "out" / "ssl",
        theirs / "loop" / "x",
    ]

    answers = [create(mallory, probe) for probe in probes]

    assert same_answers(answers, probes) == {(409, "path_taken", "Path 'X' overlaps another user's project.")}
    assert Project.objects.count() == 1


def test_through_a_link_of_ones_own_into_another_users_project_every_path_answers_the_same_409(
    api: Client, mallory: Client, allowed_root: Path
) -> None:
    theirs = directory(allowed_root / "team" / "app")
    assert create(api, theirs).status_code == 201
    directory(theirs / "src")
    (theirs / "out").symlink_to("/etc")
    mine = directory(allowed_root / "mine")
    assert create(mallory, mine).status_code == 201
    (mine / "peek").symlink_to(theirs)  # e.g. made by the user's own agent in the project
    probes = [mine / "peek" / "src", mine / "peek" / "missing", mine / "peek" / "out" / "ssl"]

    answers = [create(mallory, probe) for probe in probes]

    assert same_answers(answers, probes) == {(409, "path_taken", "Path 'X' overlaps another user's project.")}


def test_a_path_deeper_than_any_project_is_refused_before_the_disk_is_read(
    api: Client, allowed_root: Path
) -> None:
    response = create(api, allowed_root / "/".join(["a"] * 200))

    assert (response.status_code, response.json()["code"]) == (422, "path_invalid")


def test_a_sibling_whose_name_extends_another_users_path_is_not_taken(
    api: Client, mallory: Client, allowed_root: Path
) -> None:
    assert create(api, directory(allowed_root / "app")).status_code == 201
    assert create(mallory, directory(allowed_root / "app2")).status_code == 201


def test_the_same_user_may_open_one_directory_in_several_projects(api: Client, allowed_root: Path) -> None:
    path = directory(allowed_root / "repo")

    assert create(api, path).status_code == 201
    assert create(api, directory(path / "sub")).status_code == 201


def test_moving_a_project_onto_another_users_project_is_taken(
    api: Client, mallory: Client, user: Any, other_user: Any, allowed_root: Path
) -> None:
    theirs = ProjectFactory(owner=user)
    mine = ProjectFactory(owner=other_user)

    response = mallory.patch(f"/api/projects/{mine.pk}", {"path": theirs.path}, content_type=JSON)

    assert (response.status_code, response.json()["code"]) == (409, "path_taken")
    mine.refresh_from_db()
    assert mine.path != theirs.path


def test_saving_a_project_with_its_own_path_again_is_not_a_conflict(api: Client, project: Any) -> None:
    response = api.patch(f"/api/projects/{project.pk}", {"path": project.path}, content_type=JSON)

    assert response.status_code == 200


def test_the_owner_not_the_editor_decides_what_is_taken(superuser_client: Client, user: Any) -> None:
    # An admin saving a user's project onto that same user's other project is no overlap.
    # (Staff edit others' projects only in the admin: the API shows staff their own.)
    first = ProjectFactory(owner=user)

    response = admin_add(superuser_client, user, first.path)

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Project.objects.filter(owner=user, path=first.path).count() == 2


# ---------------------------------------------------------------- the runner's check


def test_the_runner_check_refuses_a_project_saved_before_the_rules(user: Any, allowed_root: Path) -> None:
    legacy = Project.objects.create(name="old", slug="old", path=str(allowed_root), agent="demo", owner=user)

    with pytest.raises(PathRefused) as refused:
        validate_project_location(legacy.path, owner_id=legacy.owner_id, project_id=legacy.pk)
    assert refused.value.code == "path_is_root"


def test_the_runner_check_refuses_a_project_another_user_now_overlaps(
    user: Any, other_user: Any, allowed_root: Path
) -> None:
    mine = ProjectFactory(owner=user)
    ProjectFactory(owner=other_user, path=mine.path)  # e.g. saved by an older admin

    with pytest.raises(PathRefused) as refused:
        validate_project_location(mine.path, owner_id=user.pk, project_id=mine.pk)
    assert (refused.value.code, refused.value.status) == ("path_taken", 409)


def test_the_runner_check_accepts_a_valid_project(project: Any) -> None:
    resolved = validate_project_location(project.path, owner_id=project.owner_id, project_id=project.pk)

    assert str(resolved) == project.path


# ---------------------------------------------------------------- the admin form


@pytest.fixture
def superuser_client() -> Client:
    return signed_in(UserFactory(username="boss", is_staff=True, is_superuser=True))


def admin_add(client: Client, owner: Any, path: Path | str) -> Any:
    return client.post(
        "/admin/projects/project/add/",
        {
            "name": "From admin",
            "slug": "from-admin",
            "path": str(path),
            "agent": "demo",
            "running_default": "queue",
            "status": "active",
            "owner": owner.pk,
            "created_at_0": "2025-01-01",
            "created_at_1": "00:00:00",
            "workflows-TOTAL_FORMS": "0",
            "workflows-INITIAL_FORMS": "0",
        },
    )


def test_the_admin_form_refuses_a_root(superuser_client: Client, user: Any, allowed_root: Path) -> None:
    response = admin_add(superuser_client, user, allowed_root)

    assert response.status_code == 200  # the form again, with the error
    assert "is an allowed root" in response.content.decode()
    assert not Project.objects.exists()


def test_the_admin_form_refuses_another_users_project(
    superuser_client: Client, user: Any, other_user: Any
) -> None:
    theirs = ProjectFactory(owner=other_user)

    response = admin_add(superuser_client, user, theirs.path)

    assert "overlaps another user" in response.content.decode()
    assert Project.objects.count() == 1


def test_the_admin_form_saves_a_valid_path_resolved(
    superuser_client: Client, user: Any, allowed_root: Path
) -> None:
    target = directory(allowed_root / "real")
    (allowed_root / "link").symlink_to(target)

    response = admin_add(superuser_client, user, allowed_root / "link")

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Project.objects.get().path == str(target.resolve())


# ---------------------------------------------------------------- the data directory


def test_a_data_directory_inside_an_allowed_root_stops_the_settings(tmp_path: Path) -> None:
    data = directory(tmp_path / "root" / "data")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERMESWEB_", "DATABASE_URL", "REDIS_URL"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="hermesweb.settings",
        HERMESWEB_DATA_DIR=str(data),
        HERMESWEB_ALLOWED_ROOTS=str(tmp_path / "root"),
    )
    env.pop("SECRET_KEY", None)

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert "HERMESWEB_DATA_DIR" in last_line
