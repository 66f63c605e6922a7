"""Each journal event type's payload, declared once (docs/journal.md, "Event types").

Zulip's `zerver/lib/event_types.py` is the model: one TypedDict per event type, declared with
what the journal's readers need to know of it in `EVENTS`, keyed by `EventType`. The runner
builds these payloads (runs/runner/translate.py, execution.py, agent_requests.py), the fold reads
them (runs/transcript.py), the writer's, the feed's and compaction's event sets come from `EVENTS`;
`payload_errors` holds a payload to its declaration (tests/test_event_payloads.py) and
`payload_table` is docs/journal.md's table. At run time payloads are plain dicts.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations only.
import types
from typing import (
    Any,
    Literal,
    NamedTuple,
    NotRequired,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from runs.models import EventType

# ---------------------------------------------------------------- the parts payloads share


class TextContent(TypedDict):
    type: Literal["text"]
    text: str


class DiffContent(TypedDict):
    type: Literal["diff"]
    path: str | None
    old_text: str | None
    new_text: str | None


class TerminalContent(TypedDict):
    type: Literal["terminal"]
    terminal_id: str | None


# What a tool card keeps of an ACP tool call's content (translate.tool_payload).
ToolContent = TextContent | DiffContent | TerminalContent


class ToolFields(TypedDict, total=False):
    """An ACP tool call's fields as the journal keeps them; the fold copies them from any tool event."""

    title: str
    tool_kind: str
    arguments: Any  # the agent's rawInput, as it sent it
    output: Any  # the agent's rawOutput
    locations: list[dict[str, Any]]
    content: list[ToolContent]


class PlanEntry(TypedDict):
    content: str
    priority: NotRequired[str]
    status: str


class ApprovalOption(TypedDict):
    option_id: str
    name: str
    kind: str


# ---------------------------------------------------------------- one payload per event type


class RunDetails(TypedDict, total=False):
    """What `run.started` says of the run beside its status: where and on what it runs."""

    session_id: int
    agent: str
    project: str
    workspace: str
    model: str | None
    mode: str | None
    runner: str
    source: str
    imported: bool


class RunStarted(RunDetails):
    status: str


class Status(TypedDict):
    status: str


class TokenDelta(TypedDict):
    message_id: str
    delta: str
    content_type: NotRequired[str]


class ReasoningDelta(TypedDict):
    reasoning_id: str
    delta: str


class ReasoningDone(TypedDict):
    reasoning_id: str


class Progress(TypedDict):
    text: str


class ToolStarted(ToolFields):
    tool_call_id: str
    status: str
    started_at: NotRequired[float]


class ToolUpdated(ToolFields):
    tool_call_id: str
    status: NotRequired[str]


class ToolDone(ToolFields):
    tool_call_id: str
    status: str
    error: NotRequired[bool]
    duration: NotRequired[float]
    closed_by: NotRequired[str]  # the turn's end closed a call the agent never completed


# What the fold reads from any of the three tool events.
ToolPayload = ToolStarted | ToolUpdated | ToolDone


class PlanUpdated(TypedDict):
    entries: list[PlanEntry]


class ApprovalRequested(TypedDict):
    approval_id: str
    tool_call_id: str | None
    title: str
    tool_kind: NotRequired[str | None]
    arguments: NotRequired[Any]
    content: NotRequired[list[ToolContent]]
    options: list[ApprovalOption]


class ApprovalResolved(TypedDict):
    approval_id: str
    outcome: Literal["selected", "cancelled"]
    option_id: NotRequired[str]
    reason: NotRequired[str]


class ClarifyRequested(TypedDict):
    clarify_id: str
    question: str
    schema: dict[str, Any]
    input_mode: Literal["form", "text"]


class ClarifyResolved(TypedDict):
    clarify_id: str
    outcome: Literal["accepted", "cancelled"]
    answer: NotRequired[Any]
    reason: NotRequired[str]


class SteerDelivered(TypedDict):
    intent_id: int
    text: str
    state: NotRequired[str]


class TitleUpdated(TypedDict):
    title: str
    source: NotRequired[str]


class Cost(TypedDict):
    # ACP's usage_update cost: the agent session's cumulative cost so far (runs/usage.py).
    amount: float
    currency: str


class UsageUpdated(TypedDict):
    used: NotRequired[int]
    size: NotRequired[int]
    cost: NotRequired[Cost]


class TerminalOutput(TypedDict):
    """What a terminal printed, by terminal: an ACP client terminal (runs/runner/terminals.py) or
    an agent's own that it reports in `_meta` (Codex; runs/runner/translate.py)."""

    terminal_id: str
    delta: str


class UsageFinal(TypedDict):
    # Beside it, the turn's usage as the agent reported it (its own keys: OPEN_PAYLOADS).
    context: NotRequired[dict[str, Any]]


class Error(TypedDict):
    code: str
    message: str
    terminal: NotRequired[bool]


class FilesRestored(TypedDict):
    """Files rewound to before a turn, or restored to a checkpoint (an undo): the event of a
    `workspace` run of its own (docs/workspace.md, "Journaled in the session")."""

    action: Literal["rewind", "restore"]
    paths: list[str]  # the first PATHS_SHOWN of them; `count` counts all
    count: int
    undo: int  # the checkpoint to restore to undo this
    undid: bool  # a restore of a rewind's or restore's checkpoint: an undo
    forced: bool
    run_id: NotRequired[int]  # the turn rewound
    turn: NotRequired[int]  # its number in the session, 1-based, workspace runs not counted


class DoneDetails(TypedDict, total=False):
    """What a terminal `done` may say beside its state (journal.done_event's keywords)."""

    stop_reason: str
    reason: str
    code: str
    usage: dict[str, Any]
    imported: bool
    forked: bool


class Done(DoneDetails):
    state: str


class EventSpec(NamedTuple):
    """An event type's declaration: its payload, and which of the journal's readers it concerns."""

    payload: type
    # A delta type: the payload key naming the segment its deltas join (the writer merges them
    # by it, compaction too, and the fold).
    segment_key: str | None = None
    # It may change the session's snapshot: its active run's status, the title (runs.live.feed).
    session_state: bool = False
    # It may change what the owner's sidebar shows of the session (runs.live.user_states).
    sidebar: bool = False
    # Its payload carries the agent's own keys beside the declared ones (usage: ACP's, Hermes'
    # token counts), and the fold keeps them all.
    open_payload: bool = False


EVENTS: dict[EventType, EventSpec] = {
    EventType.RUN_STARTED: EventSpec(RunStarted, session_state=True, sidebar=True),
    EventType.STATUS: EventSpec(Status, session_state=True, sidebar=True),
    EventType.TOKEN_DELTA: EventSpec(TokenDelta, segment_key="message_id"),
    EventType.REASONING_DELTA: EventSpec(ReasoningDelta, segment_key="reasoning_id"),
    EventType.REASONING_DONE: EventSpec(ReasoningDone),
    EventType.PROGRESS: EventSpec(Progress),
    EventType.TOOL_STARTED: EventSpec(ToolStarted),
    EventType.TOOL_UPDATED: EventSpec(ToolUpdated),
    EventType.TOOL_DONE: EventSpec(ToolDone),
    EventType.PLAN_UPDATED: EventSpec(PlanUpdated),
    EventType.APPROVAL_REQUESTED: EventSpec(ApprovalRequested, sidebar=True),
    EventType.APPROVAL_RESOLVED: EventSpec(ApprovalResolved, sidebar=True),
    EventType.CLARIFY_REQUESTED: EventSpec(ClarifyRequested, sidebar=True),
    EventType.CLARIFY_RESOLVED: EventSpec(ClarifyResolved, sidebar=True),
    EventType.STEER_DELIVERED: EventSpec(SteerDelivered),
    EventType.TITLE_UPDATED: EventSpec(TitleUpdated, session_state=True, sidebar=True),
    EventType.USAGE_UPDATED: EventSpec(UsageUpdated, open_payload=True),
    EventType.USAGE_FINAL: EventSpec(UsageFinal, open_payload=True),
    EventType.TERMINAL_OUTPUT: EventSpec(TerminalOutput, segment_key="terminal_id"),
    EventType.ERROR: EventSpec(Error),
    EventType.FILES_RESTORED: EventSpec(FilesRestored),
    EventType.DONE: EventSpec(Done, session_state=True, sidebar=True),
}

PAYLOADS: dict[EventType, type] = {event_type: spec.payload for event_type, spec in EVENTS.items()}
# A delta type → the payload key naming its segment.
DELTA_SEGMENT_KEYS: dict[EventType, str] = {
    event_type: spec.segment_key for event_type, spec in EVENTS.items() if spec.segment_key is not None
}
SESSION_STATE_EVENTS = frozenset(event_type for event_type, spec in EVENTS.items() if spec.session_state)
SIDEBAR_EVENTS = frozenset(event_type for event_type, spec in EVENTS.items() if spec.sidebar)
OPEN_PAYLOADS = frozenset(event_type for event_type, spec in EVENTS.items() if spec.open_payload)


# ---------------------------------------------------------------- checking a payload


def payload_errors(event_type: str, payload: Any) -> list[str]:
    """What is wrong with `payload` as `event_type`'s declared payload; empty when it conforms.

    Required keys must be there, every key with its declared type, and no undeclared key unless
    the type is open (`OPEN_PAYLOADS`). An int passes for a float, as JSON does not tell them apart.
    """
    declared = PAYLOADS.get(event_type)  # a str finds its EventType: they hash alike
    if declared is None:
        return [f"{event_type!r} is not an event type with a declared payload"]
    return _typeddict_errors(payload, declared, "payload", open_=event_type in OPEN_PAYLOADS)


def _typeddict_errors(value: Any, declared: Any, where: str, *, open_: bool = False) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: {type(value).__name__}, not an object ({declared.__name__})"]
    hints = get_type_hints(declared)
    errors = [f"{where}: {key!r} is missing" for key in sorted(declared.__required_keys__ - value.keys())]
    for key, item in value.items():
        if key in hints:
            errors += _errors(item, hints[key], f"{where}.{key}")
        elif not open_:
            errors.append(f"{where}: {key!r} is not declared by {declared.__name__}")
    return errors


def _errors(value: Any, declared: Any, where: str) -> list[str]:
    origin = get_origin(declared)
    if declared is Any:
        return []
    if origin in (Union, types.UnionType):
        found = [_errors(value, arm, where) for arm in get_args(declared)]
        return [] if any(not errors for errors in found) else min(found, key=len)
    if origin is Literal:
        allowed = get_args(declared)
        return [] if value in allowed else [f"{where}: {value!r} is not one of {allowed}"]
    if is_typeddict(declared):
        return _typeddict_errors(value, declared, where)
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        (item,) = get_args(declared)
        return [error for i, v in enumerate(value) for error in _errors(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            return [f"{where}: {type(value).__name__}, not an object"]
        _, item = get_args(declared)
        return [error for k, v in value.items() for error in _errors(v, item, f"{where}.{k}")]
    if declared is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    # bool is an int in Python and not in JSON; an int is a float in JSON.
    accepted = {float: (int, float), int: (int,)}.get(declared, (declared,))
    if isinstance(value, bool) and declared is not bool:
        return [f"{where}: {value!r} is not a {declared.__name__}"]
    return [] if isinstance(value, accepted) else [f"{where}: {value!r} is not a {declared.__name__}"]


# ---------------------------------------------------------------- docs/journal.md's table


def _spell(declared: Any) -> str:
    origin = get_origin(declared)
    if declared is Any:
        return "any"
    if declared is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " \\| ".join(_spell(arm) for arm in get_args(declared))
    if origin is Literal:
        return " \\| ".join(f'"{v}"' for v in get_args(declared))
    if origin is list:
        return f"list[{_spell(get_args(declared)[0])}]"
    if origin is dict:
        return "object"
    return declared.__name__


def _fields(declared: Any) -> str:
    hints = get_type_hints(declared)
    required = [key for key in hints if key in declared.__required_keys__]
    optional = [key for key in hints if key not in declared.__required_keys__]
    return ", ".join(
        [f"`{key}`: {_spell(hints[key])}" for key in required]
        + [f"`{key}?`: {_spell(hints[key])}" for key in optional]
    )


def _concerns(spec: EventSpec) -> str:
    said = [f"a delta of the segment `{spec.segment_key}`"] if spec.segment_key else []
    said += ["session snapshot"] * spec.session_state + ["owner's sidebar"] * spec.sidebar
    return ", ".join(said) or "—"


def payload_table() -> str:
    """The event types and their payloads' fields as docs/journal.md lists them (markdown)."""
    lines = ["| type | payload | fields (`?`: may be absent) | it also concerns |", "|---|---|---|---|"]
    for event_type in EventType:
        spec = EVENTS.get(event_type)
        if spec is None:
            raise LookupError(f"{event_type.value} has no EventSpec in runs/journal/payloads.py's EVENTS")
        fields = _fields(spec.payload) + (", and the agent's own keys" if spec.open_payload else "")
        lines.append(f"| `{event_type.value}` | `{spec.payload.__name__}` | {fields} | {_concerns(spec)} |")
    lines += ["", "| part | fields |", "|---|---|"]
    for part in (ToolFields, TextContent, DiffContent, TerminalContent, PlanEntry, ApprovalOption, Cost):
        lines.append(f"| `{part.__name__}` | {_fields(part)} |")
    return "\n".join(lines) + "\n"
