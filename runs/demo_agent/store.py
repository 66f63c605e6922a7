"""JSON-file persistence for demo-agent sessions.

One file per session under ``<home>/sessions/``. History entries are the exact
``session/update`` payloads (camelCase JSON) that were sent live, so ``session/load``
can replay them verbatim in a later process.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

# Session ids become file names; anything outside this alphabet could escape the directory.
_SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")

HOME_ENV = "HERMESWEB_DEMO_AGENT_HOME"
DEFAULT_HOME = "~/.hermesweb-demo-agent"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def resolve_home(cli_home: str | None) -> Path:
    raw = cli_home or os.environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(raw).expanduser().resolve()


@dataclass
class StoredSession:
    session_id: str
    cwd: str
    created_at: str
    updated_at: str
    title: str | None = None
    turns: int = 0
    # Cumulative tokens of all turns; drives the usage_update context gauge.
    context_tokens: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    # The session's mode and model (session/set_mode, session/set_model); kept across processes.
    mode: str = "default"
    model: str = "demo-small"
    # Its config option choices (session/set_config_option; runs/demo_agent/config_options.py).
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The last entry's text while chunks merge into it, joined by seal(): `+=` on a
        # growing string copies it all for every chunk (quadratic in a long turn).
        self._open_text: list[str] | None = None

    def seal(self) -> None:
        """Make `history` complete: call before reading or saving it."""
        if self._open_text is not None:
            self.history[-1]["content"]["text"] = "".join(self._open_text)
            self._open_text = None

    def append(self, update: dict[str, Any]) -> None:
        """Append one serialized update, merging consecutive chunks of the same message.

        Merging keeps files small (the live stream is a few words per chunk) while the
        replay still yields one chunk per message with the same ``messageId``.
        """
        kind = update.get("sessionUpdate")
        if kind in {"user_message_chunk", "agent_message_chunk", "agent_thought_chunk"} and self.history:
            last = self.history[-1]
            same_message = (
                last.get("sessionUpdate") == kind
                and last.get("messageId") is not None
                and last.get("messageId") == update.get("messageId")
            )
            # A tool call's content is a list: only two text blocks merge.
            last_content, content = last.get("content"), update.get("content")
            both_text = (
                isinstance(last_content, dict)
                and isinstance(content, dict)
                and last_content.get("type") == "text"
                and content.get("type") == "text"
            )
            if same_message and both_text:
                if self._open_text is None:
                    self._open_text = [last["content"]["text"]]
                self._open_text.append(update["content"]["text"])
                return
        self.seal()
        self.history.append(json.loads(json.dumps(update)))


class SessionStore:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.sessions_dir = home / "sessions"

    def _path(self, session_id: str) -> Path | None:
        if not _SESSION_ID_RE.match(session_id):
            return None
        return self.sessions_dir / f"{session_id}.json"

    def save(self, session: StoredSession) -> None:
        path = self._path(session.session_id)
        if path is None:
            raise ValueError(f"invalid session id {session.session_id!r}")
        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        session.seal()
        # A streaming turn saves twice a second and the file holds the whole history, so this
        # is the agent's hottest path: orjson, ~50x faster than json.dumps on non-ASCII text,
        # of a shallow dict (`asdict` deep-copies the history first).
        data = orjson.dumps({f.name: getattr(session, f.name) for f in fields(session)})
        # Write-then-rename so a crash mid-write never leaves a truncated file behind; the
        # temporary name is this process's own (saves within a process never overlap).
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def load(self, session_id: str) -> StoredSession | None:
        path = self._path(session_id)
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return StoredSession(**data)
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[StoredSession]:
        if not self.sessions_dir.is_dir():
            return []
        sessions = []
        for path in self.sessions_dir.glob("*.json"):
            if path.name.startswith("."):
                continue
            session = self.load(path.stem)
            if session is not None:
                sessions.append(session)
        sessions.sort(key=lambda s: (s.updated_at, s.session_id), reverse=True)
        return sessions
