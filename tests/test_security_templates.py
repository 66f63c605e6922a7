"""Workflow prompt templates are bounded: format specs at validation, the prompt at rendering.

`{x:>3000000000}` passed validation and was formatted at once (MemoryError → 500, or
gigabytes allocated); a spec could take its width from launch input (`{x:>{w}}`); and a
template repeating a 100 KB variable rendered a prompt of gigabytes.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from projects.models import Workflow
from projects.prompts import MAX_PROMPT_CHARS, MAX_SPEC_NUMBER
from runs.models import Run
from tests.factories import UserFactory, WorkflowFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"


def create(api: Client, project: Any, template: str) -> Any:
    return api.post(
        f"/api/projects/{project.pk}/workflows", {"name": "W", "prompt_template": template}, content_type=JSON
    )


def launch(api: Client, workflow: Workflow, **variables: str) -> Any:
    return api.post(f"/api/workflows/{workflow.pk}/launch", {"variables": variables}, content_type=JSON)


@pytest.mark.parametrize(
    "template",
    [
        "{x:>3000000000}",
        "{x:.5000}",
        f"{{x:0>{MAX_SPEC_NUMBER + 1}}}",
        "{x:" + "9" * 5000 + "}",  # past int()'s own digit limit: still a 422, not a 500
    ],
)
def test_a_width_or_precision_past_the_limit_is_refused_when_saved(
    api: Client, project: Any, template: str
) -> None:
    response = create(api, project, template)

    assert response.status_code == 422
    assert response.json()["code"] == "template_spec_too_large"
    assert response.json()["details"][0]["field"] == "prompt_template"
    assert not Workflow.objects.exists()


def test_a_patch_is_held_to_the_same_limit(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project)

    response = api.patch(
        f"/api/workflows/{workflow.pk}", {"prompt_template": "{x:>99999}"}, content_type=JSON
    )

    assert (response.status_code, response.json()["code"]) == (422, "template_spec_too_large")


def test_widths_up_to_the_limit_render(api: Client, project: Any) -> None:
    response = create(api, project, f"[{{x:>{MAX_SPEC_NUMBER}}}] [{{y:.3}}] {{x!r}}")

    assert response.status_code == 201
    rendered = Workflow.objects.get().render({"x": "a", "y": "abcdef"})
    assert rendered == f"[{'a':>{MAX_SPEC_NUMBER}}] [abc] 'a'"


def test_a_spec_may_not_take_its_width_from_a_variable(api: Client, project: Any) -> None:
    response = create(api, project, "{x:>{width}}")

    assert (response.status_code, response.json()["code"]) == (422, "invalid_template")


def test_a_prompt_rendered_past_the_limit_is_refused_before_anything_is_written(
    api: Client, project: Any
) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="{x}" * 20)

    response = launch(api, workflow, x="y" * 100_000)

    assert (response.status_code, response.json()["code"]) == (422, "prompt_too_large")
    assert not Run.objects.exists()
    assert str(MAX_PROMPT_CHARS) in response.json()["message"]


def test_a_template_saved_around_validation_still_renders_bounded(api: Client, project: Any) -> None:
    # An older row, or one written by hand: rendering applies the limits itself.
    workflow = WorkflowFactory(project=project, prompt_template="{x:>3000000000}")

    response = launch(api, workflow, x="a")

    assert (response.status_code, response.json()["code"]) == (422, "template_spec_too_large")
    assert not Run.objects.exists()


def test_the_admin_form_refuses_a_template_past_the_limit(project: Any) -> None:
    client = Client()
    client.force_login(UserFactory(username="boss", is_staff=True, is_superuser=True))
    workflow = WorkflowFactory(project=project, prompt_template="Go")

    response = client.post(
        f"/admin/projects/workflow/{workflow.pk}/change/",
        {
            "project": project.pk,
            "name": workflow.name,
            "description": "",
            "prompt_template": "{x:>3000000000}",
            "agent_mode": "",
            "agent_model": "",
            "created_at_0": "2025-01-01",
            "created_at_1": "00:00:00",
        },
    )

    assert response.status_code == 200  # the form again, with the error
    assert "at most 1000" in response.content.decode()
    workflow.refresh_from_db()
    assert workflow.prompt_template == "Go"
