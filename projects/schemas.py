"""API shapes for projects, workflows and sessions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import Strict, StringConstraints

from worktrees.schemas import BranchName, WorktreeOut
from worktrees.services import summary as worktree_summary

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Title = Annotated[str, StringConstraints(strip_whitespace=True, max_length=300)]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
AgentName = Annotated[str, StringConstraints(min_length=1, max_length=100)]
ShortText = Annotated[str, StringConstraints(max_length=200)]
ModeId = Annotated[str, StringConstraints(strip_whitespace=True, max_length=100)]
ModelId = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)]
ConfigId = Annotated[str, StringConstraints(min_length=1, max_length=100)]
ConfigValue = Annotated[bool, Strict()] | Annotated[str, StringConstraints(max_length=200)] | None
LongText = Annotated[str, StringConstraints(max_length=100_000)]
Template = Annotated[str, StringConstraints(min_length=1, max_length=100_000)]
RunningDefaultName = Literal["queue", "steer"]
SessionStatusName = Literal["active", "archived"]
ProjectStatusName = Literal["active", "archived"]


# ---------------------------------------------------------------- projects


LabelText = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ProjectIn(Schema):
    name: Name
    path: PathText = Field(description="Absolute directory inside one of the operator's allowed roots.")
    agent: AgentName | None = Field(
        None, description="A configured agent; the operator's default if omitted."
    )
    running_default: RunningDefaultName = "queue"
    required_labels: list[LabelText] = Field(
        default_factory=list, max_length=32, description='Labels a runner must offer, e.g. ["host=build-1"].'
    )


class ProjectPatch(Schema):
    name: Name | None = None
    path: PathText | None = None
    agent: AgentName | None = None
    running_default: RunningDefaultName | None = None
    status: ProjectStatusName | None = Field(
        None, description="archived: out of the default list; its sessions take no new messages."
    )
    required_labels: list[LabelText] | None = Field(None, max_length=32, description="Runner labels needed.")


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
    required_labels: list[str] = Field(description="Labels a runner must offer to run its turns.")
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
    worktree: bool = Field(False, description="A new session works in a git worktree of its own.")
    branch: BranchName = Field("", description="With `worktree`: the new branch (default: made up).")
    base: BranchName = Field("", description="With `worktree`: the branch to start from (default: current).")


# ---------------------------------------------------------------- sessions


class SessionIn(Schema):
    title: Title = ""
    # docs/worktrees.md: its own git worktree on a new branch, made by the runner before turn one.
    worktree: bool = Field(False, description="Work in a worktree of its own (the project must be git).")
    branch: BranchName = Field("", description="The new branch (default: hermesweb/session-<id>).")
    base: BranchName = Field("", description="The branch to start from and merge into (default: current).")


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
    config: dict[ConfigId, ConfigValue] | None = Field(
        None,
        description="Choices among the session's `config_options` by option id (merged with the earlier"
        ' ones): a select\'s value id or a boolean; "" or null clears one. 422 `unknown_config_option`'
        " / `invalid_config_value`. Sent to the agent (session/set_config_option) before the next turn.",
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


class ConfigValueOut(Schema):
    value: str
    name: str
    description: str = ""
    group: str = Field("", description="The label of the group it is in, if the agent grouped them.")


class ConfigOptionOut(Schema):
    id: str
    name: str
    description: str = ""
    category: str = Field("", description="The agent's hint: mode, model, thought_level, … or empty.")
    type: Literal["select", "boolean"]
    current: str | bool = Field(description="The value the agent last reported as current.")
    values: list[ConfigValueOut] = Field(description="A select's values (empty for a boolean).")


class SessionUsageOut(Schema):
    runs: int = Field(description="Turns that reported token usage.")
    tokens: dict[str, int] = Field(description="Token counts summed over the turns, by the agent's keys.")
    context: dict[str, Any] = Field(description="The last `usage_update`: `used`, `size`, `cost`.")
    cost: dict[str, Any] | None = Field(None, description="The agent's cumulative cost {amount, currency}.")


class WaitingOut(Schema):
    """Why a queued turn has not started (runs/capacity.py); null once it is about to."""

    reason: Literal["waiting_for_slot", "waiting_for_runner"]
    running: int = Field(0, description="waiting_for_slot: the user's turns executing now.")
    position: int = Field(0, description="waiting_for_slot: 1 for the user's next turn to start.")
    labels: list[str] = Field(default_factory=list, description="waiting_for_runner: labels it needs.")
    path: str = Field("", description="waiting_for_runner: the directory a runner must serve.")


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
    config_options: list[ConfigOptionOut] = Field(
        description="The agent's config options for this session (empty: none reported)."
    )
    config: dict[str, Any] = Field(
        description="The chosen config values by option id, applied before the next turn."
    )
    usage: SessionUsageOut | None = Field(None, description="Usage totals: in GET /api/sessions/{id} only.")
    active_run_id: int | None = Field(None, description="The run currently queued or executing, if any.")
    waiting: WaitingOut | None = Field(None, description="Why its queued turn waits (single reads only).")
    worktree: WorktreeOut | None = Field(None, description="Its own git worktree (docs/worktrees.md).")
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_waiting(obj: Any) -> Any:
        return getattr(obj, "waiting", None)  # set by the single-session read only

    @staticmethod
    def resolve_worktree(obj: Any) -> Any:
        return worktree_summary(obj)

    @staticmethod
    def resolve_modes(obj: Any) -> list[dict[str, Any]]:
        return [m for m in obj.available_modes or [] if isinstance(m, dict) and m.get("id")]

    @staticmethod
    def resolve_models(obj: Any) -> list[dict[str, Any]]:
        return [m for m in obj.available_models or [] if isinstance(m, dict) and m.get("id")]

    @staticmethod
    def resolve_usage(obj: Any) -> Any:
        return getattr(obj, "usage_total", None)  # set by the single-session read only

    @staticmethod
    def resolve_active_run_id(obj: Any) -> int | None:
        # List views annotate it in the query; a single session asks.
        if hasattr(obj, "active_run_id"):
            return obj.active_run_id
        run = obj.active_run()
        return run.pk if run is not None else None
