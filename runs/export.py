"""Transcripts as Markdown or JSON, materialized from the journal, produced run by run.

A session may hold any number of runs: the exports are generators that read one run and its
events at a time (`.iterator()` reads), so memory stays that of the largest run, never of the
session. `streamed` hands such a generator to an ASGI server without collecting it first.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import orjson
from asgiref.sync import sync_to_async

from intents.models import PendingIntent
from intents.services import intent_dict
from projects.models import Session
from runs.models import JournalEvent, Run, RunSource
from runs.transcript import materialize

JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS


def run_turn(run: Run) -> dict[str, Any]:
    state = materialize(JournalEvent.objects.filter(run=run).order_by("seq").iterator(chunk_size=500))
    return {
        "run_id": run.pk,
        "status": run.status,
        "source": run.source,
        # A rewind or restore (a `workspace` run) was nobody's prompt: its item says what it did.
        "prompt": None
        if run.source == RunSource.WORKSPACE
        else {"text": run.prompt_text, "attachments": run.attachments},
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "stop_reason": run.stop_reason or None,
        "error": run.error or None,
        "usage": run.usage,
        "state": state,
    }


def session_turns(session: Session) -> Iterator[dict[str, Any]]:
    for run in Run.objects.filter(session=session).order_by("created_at", "id").iterator(chunk_size=100):
        yield run_turn(run)


def session_head(session: Session) -> dict[str, Any]:
    return {
        "id": session.pk,
        "title": session.title,
        "project": {"id": session.project_id, "name": session.project.name, "path": session.project.path},
        "agent": session.project.agent,
        "agent_session_id": session.agent_session_id,
        "created_at": session.created_at.isoformat(),
    }


def open_intents(session: Session) -> list[dict[str, Any]]:
    return [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in intent_dict(i).items()}
        for i in PendingIntent.objects.filter(session=session).open()
    ]


def session_json(session: Session) -> dict[str, Any]:
    """The whole export as one object (the management command's; the API streams `json_chunks`)."""
    return {
        "session": session_head(session),
        "turns": list(session_turns(session)),
        "intents": open_intents(session),
    }


def _indented(value: Any, depth: int) -> str:
    # orjson escapes newlines inside strings, so every raw newline is indentation.
    return orjson.dumps(value, option=JSON_OPTIONS).decode().replace("\n", "\n" + "  " * depth)


def json_chunks(session: Session) -> Iterator[bytes]:
    """`session_json` as indented JSON text, a turn at a time."""
    yield f'{{\n  "session": {_indented(session_head(session), 1)},\n  "turns": ['.encode()
    for index, turn in enumerate(session_turns(session)):
        yield f"{',' if index else ''}\n    {_indented(turn, 2)}".encode()
    yield f'\n  ],\n  "intents": {_indented(open_intents(session), 1)}\n}}\n'.encode()


def _fence(text: str, info: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{info}\n{text}\n{fence}"


def item_markdown(item: dict[str, Any]) -> str:
    kind = item["kind"]
    if kind == "text":
        return item["text"].strip()
    if kind == "reasoning":
        return "\n".join(f"> {line}" for line in ("*Reasoning:* " + item["text"].strip()).splitlines())
    if kind == "tool":
        head = f"**Tool** `{item.get('title') or item.get('tool_call_id')}` — {item.get('status', '')}"
        parts = [head]
        if item.get("arguments"):
            parts.append(_fence(json.dumps(item["arguments"], indent=2, ensure_ascii=False), "json"))
        for content in item.get("content", []):
            if content.get("type") == "text" and content.get("text"):
                parts.append(_fence(content["text"]))
            elif content.get("type") == "diff":
                old = (content.get("old_text") or "").splitlines()
                new = (content.get("new_text") or "").splitlines()
                diff = [f"--- {content.get('path')}", f"+++ {content.get('path')}"]
                diff += [f"-{line}" for line in old] + [f"+{line}" for line in new]
                parts.append(_fence("\n".join(diff), "diff"))
        return "\n\n".join(parts)
    if kind == "plan":
        marks = {"completed": "x", "in_progress": "~", "pending": " "}
        return "\n".join(f"- [{marks.get(e['status'], ' ')}] {e['content']}" for e in item["entries"])
    if kind == "approval":
        outcome = item.get("choice") or item.get("outcome") or "unanswered"
        return f"**Approval** {item.get('title', '')}: {outcome}"
    if kind == "clarify":
        answer = item.get("answer")
        return (
            f"**Question** {item.get('question', '')}\n\n**Answer** {json.dumps(answer, ensure_ascii=False)}"
        )
    if kind == "steer":
        return f"*Steer:* {item['text']}"
    if kind == "error":
        return f"**Error** ({item.get('code')}): {item.get('message')}"
    if kind == "files_restored":
        return files_restored_line(item)
    return ""


def files_restored_line(item: dict[str, Any]) -> str:
    """A rewind's or restore's words, as the transcript shows them (static/js/changes.js)."""
    count = item.get("count", len(item.get("paths") or []))
    files = f"{count} file{'' if count == 1 else 's'}"
    if item.get("action") == "rewind":
        where = f"turn {item['turn']}" if item.get("turn") else "a turn"
        return f"*Files restored to before {where} — {files}*"
    if item.get("undid"):
        return f"*Rewind undone — {files} put back*"
    return f"*Files restored — {files}*"


def markdown_chunks(session: Session) -> Iterator[bytes]:
    """The session as Markdown, a turn at a time."""
    head = [f"# {session.title or f'Session {session.pk}'}", ""]
    head.append(
        f"Project: {session.project.name} (`{session.project.path}`) · agent `{session.project.agent}`"
    )
    yield ("\n".join(head) + "\n").encode()
    for turn in session_turns(session):
        yield turn_markdown(turn).encode()
    intents = open_intents(session)
    if intents:
        yield (
            "\n".join(["", "---", "", "## Waiting", ""] + [f"- {i['text']}" for i in intents]).encode()
            + b"\n"
        )


def turn_markdown(turn: dict[str, Any]) -> str:
    if turn["prompt"] is None:  # a rewind or restore: its one line, no prompt nor answer
        items = [item_markdown(item) for item in turn["state"]["items"]]
        return "\n".join(["", "---", "", *[text for text in items if text], ""])
    lines = ["", "---", "", f"## You ({turn['created_at']})", "", turn["prompt"]["text"], "", "## Agent", ""]
    for item in turn["state"]["items"]:
        rendered = item_markdown(item)
        if rendered:
            lines += [rendered, ""]
    state = turn["state"]
    if state["terminal_state"] and state["terminal_state"] != "completed":
        reason = state.get("terminal_reason") or state.get("stop_reason") or ""
        lines += [f"*Run {state['terminal_state']}{': ' + reason if reason else ''}*", ""]
    return "\n".join(lines)


def session_markdown(session: Session) -> str:
    return b"".join(markdown_chunks(session)).decode().rstrip() + "\n"


async def streamed(chunks: Iterable[bytes], batch: int = 8) -> AsyncIterator[bytes]:
    """Serve a generator that reads the database from an async server, a few chunks per thread hop.

    Django's ASGI handler would collect a synchronous generator into one list first. The reads
    run in the request's own thread (thread_sensitive), where its database connection lives.
    """
    iterator = iter(chunks)
    take = sync_to_async(lambda: list(itertools.islice(iterator, batch)), thread_sensitive=True)
    while parts := await take():
        for part in parts:
            yield part
