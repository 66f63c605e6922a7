"""API shapes for projects, workflows and sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import Strict, StringConstraints

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Title = Annotated[str, StringConstraints(strip_whitespace=True, max_length=300)]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
AgentName = Annotated[str, StringConstraints(min_length=1, max_length=100)]
ShortText = Annotated[str, StringConstraints(max_length=200)]
ModeId = Annotated[str, StringConstraints(strip_whitespace=True, max_length=100)]
ModelId = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)]
LongText = Annotated[str, StringConstraints(max_length=100_000)]
Template = Annotated[str, StringConstraints(min_length=1, max_length=100_000)]
RunningDefaultName = Literal["queue", "steer"]
SessionStatusName = Literal["active", "archived"]
ProjectStatusName = Literal["active", "archived"]


# ---------------------------------------------------------------- projects


class ProjectIn(Schema):
    name: Name
    path: PathText = Field(description="Absolute directory inside one of the operator's allowed roots.")
    agent: AgentName | None = Field(
        None, description="A configured agent; the operator's default if omitted."
    )
    running_default: RunningDefaultName = "queue"


class ProjectPatch(Schema):
    name: Name | None = None
    path: PathText | None = None
    agent: AgentName | None = None
    running_default: RunningDefaultName | None = None
    status: ProjectStatusName | None = Field(
        None, description="archived: out of the default list; its sessions take no new messages."
    )


class ProjectFilter(Schema):
    include_archived: bool = Field(False, description="Archived projects too.")


class ProjectOut(Schema):
    id: int
    name: str
    slug: str
    path: str
    agent: str
    running_default: str
    status: str
    owner_id: int
    created_at: datetime
    updated_at: datetime


# ---------------------------------------------------------------- workflows


class WorkflowIn(Schema):
    name: Name
    prompt_template: Template = Field(description="Text with {variables}; {{ and }} for literal braces.")
    description: LongText = ""
    agent_mode: Annotated[str, StringConstraints(max_length=100)] = ""
    agent_model: ShortText = ""


class WorkflowPatch(Schema):
    name: Name | None = None
    prompt_template: Template | None = None
    description: LongText | None = None
    agent_mode: Annotated[str, StringConstraints(max_length=100)] | None = None
    agent_model: ShortText | None = None


class WorkflowOut(Schema):
    id: int
    project_id: int
    name: str
    description: str
    prompt_template: str
    variables: list[str]
    agent_mode: str
    agent_model: str
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_variables(obj: Any) -> list[str]:
        return obj.variables()


class LaunchIn(Schema):
    session_id: Annotated[int, Strict()] | None = Field(
        None, description="Run in this session; a new one is created if omitted."
    )
    variables: dict[Annotated[str, StringConstraints(max_length=100)], LongText] = Field(default_factory=dict)
    client_id: Annotated[str, StringConstraints(min_length=1, max_length=100)] | None = Field(
        None, description="Idempotency key; launching again with the same one is a duplicate."
    )


# ---------------------------------------------------------------- sessions


class SessionIn(Schema):
    title: Title = ""


class SessionPatch(Schema):
    title: Title | None = None
    status: SessionStatusName | None = None
    mode: ModeId | None = Field(
        None, description='One of the session\'s `modes` ids (else 422 `unknown_mode`); "" clears it.'
    )
    model: ModelId | None = Field(
        None,
        description='Any model id the agent\'s provider serves (`models` are suggestions); "" clears it.',
    )


class SessionFilter(Schema):
    status: SessionStatusName | None = Field(None, description="Only active or only archived sessions.")


class ModeOut(Schema):
    id: str
    name: str
    description: str = ""


class ModelOut(Schema):
    id: str
    name: str


class SessionOut(Schema):
    id: int
    project_id: int
    title: str
    agent_session_id: str
    status: str
    model: str = Field(description='The chosen model id, applied before the next turn; "" for the agent\'s.')
    mode: str = Field(description='The chosen mode id, applied before the next turn; "" for the agent\'s.')
    modes: list[ModeOut] = Field(
        description="The modes the agent reported for this session (empty: none yet)."
    )
    models: list[ModelOut] = Field(
        description="The models the agent listed (empty: none); other ids the agent takes may be chosen too."
    )
    commands: list[Any]
    active_run_id: int | None = Field(None, description="The run currently queued or executing, if any.")
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_modes(obj: Any) -> list[dict[str, Any]]:
        return [m for m in obj.available_modes or [] if isinstance(m, dict) and m.get("id")]

    @staticmethod
    def resolve_models(obj: Any) -> list[dict[str, Any]]:
        return [m for m in obj.available_models or [] if isinstance(m, dict) and m.get("id")]

    @staticmethod
    def resolve_active_run_id(obj: Any) -> int | None:
        # List views annotate it in the query; a single session asks.
        if hasattr(obj, "active_run_id"):
            return obj.active_run_id
        run = obj.active_run()
        return run.pk if run is not None else None
