"""Transcripts as Markdown or JSON, materialized from the journal."""

from __future__ import annotations

import json
from typing import Any

from intents.models import PendingIntent
from intents.services import intent_dict
from projects.models import Session
from runs.models import JournalEvent, Run
from runs.transcript import materialize


def run_turn(run: Run) -> dict[str, Any]:
    state = materialize(JournalEvent.objects.filter(run=run).order_by("seq"))
    return {
        "run_id": run.pk,
        "status": run.status,
        "source": run.source,
        "prompt": {"text": run.prompt_text, "attachments": run.attachments},
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "stop_reason": run.stop_reason or None,
        "error": run.error or None,
        "usage": run.usage,
        "state": state,
    }


def session_json(session: Session) -> dict[str, Any]:
    runs = Run.objects.filter(session=session).order_by("created_at", "id")
    return {
        "session": {
            "id": session.pk,
            "title": session.title,
            "project": {"id": session.project_id, "name": session.project.name, "path": session.project.path},
            "agent": session.project.agent,
            "agent_session_id": session.agent_session_id,
            "created_at": session.created_at.isoformat(),
        },
        "turns": [run_turn(run) for run in runs],
        "intents": [
            {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in intent_dict(i).items()}
            for i in PendingIntent.objects.filter(session=session).open()
        ],
    }


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
    return ""


def session_markdown(session: Session) -> str:
    data = session_json(session)
    lines = [f"# {session.title or f'Session {session.pk}'}", ""]
    lines.append(
        f"Project: {session.project.name} (`{session.project.path}`) · agent `{session.project.agent}`"
    )
    for turn in data["turns"]:
        lines += [
            "",
            "---",
            "",
            f"## You ({turn['created_at']})",
            "",
            turn["prompt"]["text"],
            "",
            "## Agent",
            "",
        ]
        for item in turn["state"]["items"]:
            rendered = item_markdown(item)
            if rendered:
                lines += [rendered, ""]
        state = turn["state"]
        if state["terminal_state"] and state["terminal_state"] != "completed":
            reason = state.get("terminal_reason") or state.get("stop_reason") or ""
            lines += [f"*Run {state['terminal_state']}{': ' + reason if reason else ''}*", ""]
    if data["intents"]:
        lines += ["---", "", "## Waiting", ""] + [f"- {i['text']}" for i in data["intents"]]
    return "\n".join(lines).rstrip() + "\n"
