"""The workbench pages without a browser: sign-in, redirects, embedded data, fragments, static files.

The real-browser tests are tests/test_browser_workbench.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from tests import factories

pytestmark = [pytest.mark.django_db, pytest.mark.browser]


def embedded(response: Any) -> dict[str, Any]:
    match = re.search(
        r'<script id="workbench-data" type="application/json">(.*?)</script>', response.content.decode(), re.S
    )
    assert match, "the workbench data block is missing"
    return json.loads(match.group(1))


@pytest.mark.parametrize("path", ["/", "/projects/1/", "/sessions/1/", "/sessions/1/fragment"])
def test_every_page_sends_anonymous_users_to_sign_in(anonymous: Client, path: str) -> None:
    response = anonymous.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_the_sign_in_page_signs_in_and_goes_where_it_was_asked(anonymous: Client, user: Any) -> None:
    page = anonymous.get("/login/?next=/sessions/5/")
    assert page.status_code == 200
    assert b'name="password"' in page.content
    assert "script-src 'self'" in page["Content-Security-Policy"]
    response = anonymous.post(
        "/login/", {"username": "ada", "password": "correct horse battery staple", "next": "/sessions/5/"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/sessions/5/"


def test_a_wrong_password_is_refused_on_the_page(anonymous: Client, user: Any) -> None:
    response = anonymous.post("/login/", {"username": "ada", "password": "nope"})
    assert response.status_code == 200
    assert b'role="alert"' in response.content


def test_sign_out_needs_a_post(api: Client) -> None:
    assert api.get("/logout/").status_code == 405
    response = api.post("/logout/")
    assert response.status_code == 302
    assert response["Location"] == "/login/"
    assert api.get("/").status_code == 302


def test_home_lands_in_the_project_worked_on_last(api: Client, user: Any) -> None:
    factories.ProjectFactory(owner=user, name="A")
    recent = factories.SessionFactory(project=factories.ProjectFactory(owner=user, name="B"))
    response = api.get("/")
    assert response.status_code == 302
    assert response["Location"] == f"/projects/{recent.project_id}/"


def test_home_without_projects_renders_the_empty_workbench(api: Client) -> None:
    response = api.get("/")
    assert response.status_code == 200
    data = embedded(response)
    assert data["projects"] == []
    assert data["project"] is None
    assert "Content-Security-Policy" in response


def test_the_project_page_embeds_the_project_its_sessions_and_workflows(api: Client, project: Any) -> None:
    session = factories.SessionFactory(project=project, title="Fix the bug")
    workflow = factories.WorkflowFactory(project=project)
    factories.ProjectFactory()  # someone else's
    response = api.get(f"/projects/{project.pk}/")
    assert response.status_code == 200
    data = embedded(response)
    assert data["project"]["id"] == project.pk
    assert data["project"]["running_default"] == "queue"
    assert [p["id"] for p in data["projects"]] == [project.pk]
    assert [s["id"] for s in data["sessions"]] == [session.pk]
    assert data["workflows"][0]["variables"] == workflow.variables()
    assert data["session"] is None
    assert '<script type="module"' in response.content.decode()


def test_the_session_page_embeds_the_session_with_its_active_run(api: Client, session: Any) -> None:
    run = factories.RunFactory(session=session, status="running")
    data = embedded(api.get(f"/sessions/{session.pk}/"))
    assert data["session"]["id"] == session.pk
    assert data["session"]["active_run_id"] == run.pk
    assert data["project"]["id"] == session.project_id


def test_a_title_cannot_break_out_of_the_data_block(api: Client, session: Any) -> None:
    session.title = "</script><script>alert(1)</script>"
    session.save()
    response = api.get(f"/sessions/{session.pk}/")
    body = response.content.decode()
    assert "<script>alert(1)</script>" not in body
    assert embedded(response)["session"]["title"] == session.title


def test_someone_elses_pages_are_not_found(api: Client, other_user: Any) -> None:
    theirs = factories.SessionFactory(project=factories.ProjectFactory(owner=other_user))
    assert api.get(f"/projects/{theirs.project_id}/").status_code == 404
    assert api.get(f"/sessions/{theirs.pk}/").status_code == 404
    assert api.get(f"/sessions/{theirs.pk}/fragment").status_code == 404
    run = factories.RunFactory(session=theirs)
    assert api.get(f"/sessions/{theirs.pk}/runs/{run.pk}/fragment").status_code == 404


def settled_run(session: Any, text: str) -> Any:
    return factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("token.delta", {"message_id": "m1", "delta": text}),
            ("tool.started", {"tool_call_id": "t1", "title": "ls", "tool_kind": "execute"}),
            ("token.delta", {"message_id": "m2", "delta": "**after** the tool"}),
            ("done", {"state": "completed", "stop_reason": "end_turn"}),
        ],
        session=session,
        status="running",
    )


def test_the_fragment_renders_each_text_item_sanitized(api: Client, session: Any) -> None:
    run = settled_run(session, "## Hi\n<img src=x onerror=alert(1)> <script>alert(2)</script>")
    response = api.get(f"/sessions/{session.pk}/runs/{run.pk}/fragment")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    body = response.content.decode()
    assert f'data-run="{run.pk}"' in body
    assert 'data-last-seq="5"' in body
    assert 'data-terminal="true"' in body
    # Items 0 and 2 are text; 1 is the tool card the browser draws itself.
    assert '<div class="md" data-item="0" data-message-id="m1"><h2>Hi</h2>' in body
    assert '<div class="md" data-item="2" data-message-id="m2"><p><strong>after</strong> the tool</p>' in body
    assert "<img" not in body
    assert "<script" not in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body


def test_the_session_fragment_defaults_to_settled_runs(api: Client, session: Any) -> None:
    settled = settled_run(session, "done")
    active = factories.RunFactory(session=session, status="running")
    body = api.get(f"/sessions/{session.pk}/fragment").content.decode()
    assert f'data-run="{settled.pk}"' in body
    assert f'data-run="{active.pk}"' not in body
    picked = api.get(f"/sessions/{session.pk}/fragment?runs={active.pk}").content.decode()
    assert f'data-run="{active.pk}"' in picked
    assert f'data-run="{settled.pk}"' not in picked


@pytest.mark.parametrize("runs", ["x", "1;2", "-1", "9" * 30, ",".join(["1"] * 501)])
def test_the_session_fragment_refuses_junk_ids(api: Client, session: Any, runs: str) -> None:
    assert api.get(f"/sessions/{session.pk}/fragment", {"runs": runs}).status_code == 400


def test_a_run_of_another_session_has_no_fragment_here(api: Client, project: Any) -> None:
    one = factories.SessionFactory(project=project)
    other = factories.SessionFactory(project=project)
    run = factories.RunFactory(session=other)
    assert api.get(f"/sessions/{one.pk}/runs/{run.pk}/fragment").status_code == 404


def test_a_session_page_offers_its_transcript_as_markdown_and_json(api: Client, user: Any) -> None:
    session = factories.SessionFactory(project__owner=user)
    html = api.get(f"/sessions/{session.pk}/").content.decode()
    for fmt in ("markdown", "json"):
        href = f"/api/sessions/{session.pk}/export?format={fmt}"
        assert f'href="{href}"' in html
        assert api.get(href).status_code == 200
