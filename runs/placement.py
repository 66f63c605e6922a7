"""Placement: which runner may run which project's turns, and what no live runner can serve.

Design note: docs/runner.md ("Placement"). A runner offers labels (`runner --labels`,
HERMESWEB_RUNNER_LABELS) and serves the project roots of its own HERMESWEB_ALLOWED_ROOTS; a
project (`required_labels`) and its agent entry (`labels`) may require labels. The claim
(runs.runner.leases) takes a run only where both match; here the same rule is read for the
web (a run's waiting state, /api/health, doctor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from ninja import Field, Schema

from projects.models import Project, ProjectStatus
from runs.labels import missing, parse_labels, under_roots
from runs.models import Runner

# `runner --labels` (runs/management/commands/runner.py) overrides HERMESWEB_RUNNER_LABELS.
_labels_override: tuple[str, ...] | None = None


def use_labels(labels: tuple[str, ...] | None) -> None:
    """This process's runner offers `labels` (None: HERMESWEB_RUNNER_LABELS again)."""
    global _labels_override
    _labels_override = labels


@dataclass(frozen=True)
class Offer:
    """What one runner can serve: its labels, its roots, the agent entries whose labels it lacks."""

    labels: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    unserved_agents: tuple[str, ...] = ()

    def serves(self, path: str, required: list[str], agent: str) -> bool:
        return (
            agent not in self.unserved_agents
            and not missing(required, self.labels)
            and under_roots(path, self.roots)
        )


def offer(labels: tuple[str, ...], roots: list[str]) -> Offer:
    """The offer of a runner with these labels and roots, against the agent entries configured here."""
    unserved = tuple(
        sorted(name for name, spec in settings.HERMESWEB_AGENTS.items() if missing(spec.labels, labels))
    )
    return Offer(labels, tuple(roots), unserved)


def this_runner() -> Offer:
    """This process's offer; read at each claim (tests change the roots per test)."""
    labels = _labels_override
    if labels is None:
        labels = parse_labels(settings.HERMESWEB_RUNNER_LABELS)
    return offer(labels, [str(root) for root in settings.HERMESWEB_ALLOWED_ROOTS])


def required_labels(project_labels: list[str], agent: str) -> list[str]:
    """Every label a run of a project with these labels on `agent` needs."""
    spec = settings.HERMESWEB_AGENTS.get(agent)
    return sorted({*project_labels, *(spec.labels if spec else ())})


def live_offers() -> list[Offer]:
    """What the runners alive now advertise."""
    rows = Runner.objects.alive().values_list("labels", "roots")
    return [offer(tuple(labels or ()), list(roots or ())) for labels, roots in rows]


def served(project: Project, offers: list[Offer]) -> bool:
    return any(o.serves(project.path, list(project.required_labels or []), project.agent) for o in offers)


class Unserved(NamedTuple):
    """A project no live runner can serve, and the labels its turns need."""

    project_id: int
    name: str
    owner: str
    labels: list[str]


def unserved_projects() -> list[Unserved]:
    """Active projects whose turns would wait: no live runner matches their labels and root."""
    offers = live_offers()
    found = []
    for project in Project.objects.filter(status=ProjectStatus.ACTIVE).select_related("owner").order_by("pk"):
        if not served(project, offers):
            labels = required_labels(list(project.required_labels or []), project.agent)
            found.append(Unserved(project.pk, project.name, project.owner.get_username(), labels))
    return found


class UnservedOut(Schema):
    project_id: int
    name: str
    labels: list[str] = Field(description="The labels its turns need (its project's and its agent's).")


class PlacementHealth(Schema):
    """The user's own projects no live runner can serve (their turns wait, docs/runner.md
    "Placement"); staff see every user's in the admin and `doctor`, never through the API.
    Reported, never failed: a runner may yet start."""

    ok: bool
    unserved: list[UnservedOut]


def placement_health(user: Any) -> PlacementHealth:
    found = [u for u in unserved_projects() if u.owner == user.get_username()]
    unserved = [UnservedOut(project_id=u.project_id, name=u.name, labels=u.labels) for u in found[:100]]
    return PlacementHealth(ok=not unserved, unserved=unserved)


def served_projects_text(runner: Runner, shown: int = 5) -> str:
    """What the admin shows of a runner: how many active projects it can serve, and a few names."""
    this = offer(tuple(runner.labels or ()), list(runner.roots or ()))
    projects = Project.objects.filter(status=ProjectStatus.ACTIVE).order_by("pk")
    names = [p.name for p in projects if this.serves(p.path, list(p.required_labels or []), p.agent)]
    more = f", … (+{len(names) - shown})" if len(names) > shown else ""
    return f"{len(names)} project(s): {', '.join(names[:shown])}{more}" if names else "no project"
