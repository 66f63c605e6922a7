"""Deterministic scripts the demo agent plays, chosen by trigger words in the prompt."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from acp import RequestError
from acp.helpers import text_block, tool_content, tool_diff_content
from acp.schema import AcceptElicitationResponse, PlanEntryStatus, ToolCallLocation

from .client_scripts import CLIENT_TRIGGERS
from .turn import Turn

Script = Callable[[Turn], Awaitable[None]]

_WORD_RE = re.compile(r"[a-z0-9_]+")

SLOW_CHUNKS = 300
# The slow script must stay cancellable by a human even when HERMESWEB_DEMO_DELAY is ~0.
SLOW_MIN_DELAY = 0.05
# `hold` streams until the test creates HOLD_RELEASE_FILE in the session cwd (the sandbox binds
# the project read-write), polled once per chunk; the bound ends it by itself so nothing hangs.
HOLD_RELEASE_FILE = "hold-release"
HOLD_POLL_SECONDS = 0.05
HOLD_MAX_SECONDS_ENV = "HERMESWEB_DEMO_HOLD_SECONDS"
HOLD_MAX_SECONDS = 120.0
TOOLLOOP_STEPS = 5
# Fixed (not scaled by the delay or `fast`) so steer tests always have a turn to steer.
TOOLLOOP_STEP_SECONDS = 0.4
EDIT_FILE = "demo-edit.txt"
APPROVE_FILE = "approved.txt"
ASK_QUESTION = "Which colour should I use?"


def prompt_words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def wants_fast(text: str) -> bool:
    return "fast" in prompt_words(text)


def derive_title(text: str, max_words: int = 6, max_chars: int = 60) -> str:
    words = re.sub(r"[^\w\s'-]", " ", text).split()
    title = " ".join(words[:max_words]) or "Untitled"
    if len(title) > max_chars:
        title = title[: max_chars - 1].rstrip() + "…"
    return title[0].upper() + title[1:]


# ---------------------------------------------------------------------------- scripts


async def run_default(turn: Turn) -> None:
    quoted = "\n".join(f"> {line}" if line else ">" for line in turn.prompt_text.strip().splitlines()) or ">"
    words = len(turn.prompt_text.split())
    text = (
        "## Demo answer\n\n"
        f"You said:\n\n{quoted}\n\n"
        "I am the **hermesweb demo agent**: no model, just scripts picked by trigger words.\n\n"
        "- `think` shows reasoning before the answer\n"
        "- `tool` runs a pretend `ls`\n"
        "- `approve` and `edit` ask for permission\n"
        "- `plan`, `ask`, `slow`, `toolloop` and `crash` do what they say\n"
        f"- `hold` streams until a file `{HOLD_RELEASE_FILE}` appears in the working directory\n\n"
        "```python\n"
        "def count_words(prompt: str) -> int:\n"
        "    return len(prompt.split())\n"
        "\n"
        f"assert count_words(prompt) == {words}\n"
        "```\n\n"
        "Add `fast` to any prompt to skip the typing delay."
    )
    await turn.say(text)


async def run_think(turn: Turn) -> None:
    await turn.think("Reading the request carefully. ")
    await turn.think("Weighing a couple of ways to answer it. ")
    await turn.think("The simplest answer is the right one here.")
    await turn.say("After thinking it over: this is a scripted answer, and the reasoning above came first.")


def _listing(cwd: str) -> str:
    try:
        names = sorted(os.listdir(cwd))
    except OSError as exc:
        return f"ls: cannot access '{cwd}': {exc.strerror}"
    if not names:
        return "(empty directory)"
    shown = names[:20]
    more = f"\n… and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    return "\n".join(shown) + more


async def run_tool(turn: Turn) -> None:
    await turn.say("Let me look at the working directory first.")
    call = await turn.start_tool("ls", kind="execute", status="in_progress", raw_input={"command": "ls"})
    await turn.pause(turn.delay * 5)
    output = _listing(turn.cwd)
    await turn.update_tool(call, content=[tool_content(text_block(output))])
    await turn.update_tool(call, status="completed", raw_output={"exit_code": 0, "stdout": output})
    entries = 0 if output.startswith(("(empty", "ls:")) else len(output.splitlines())
    await turn.say(f"\n\nThe directory listing has {entries} entries.")


async def _guarded_write(
    turn: Turn, *, filename: str, new_text: str, old_text: str | None, title: str
) -> tuple[bool, str]:
    """A write tool call that asks permission first; returns (allowed, absolute path)."""
    path = str(Path(turn.cwd) / filename)
    call = await turn.start_tool(
        title,
        kind="edit",
        status="pending",
        raw_input={"path": path, "content": new_text},
        content=[tool_diff_content(path, new_text, old_text)],
        locations=[ToolCallLocation(path=path)],
    )
    allowed = await turn.ask_permission(call, title, memory_key="write_file")
    if not allowed:
        await turn.update_tool(call, status="failed", raw_output={"error": "denied by user"})
        return False, path
    await turn.update_tool(call, status="in_progress")
    try:
        Path(path).write_text(new_text, encoding="utf-8")
    except OSError as exc:
        await turn.update_tool(call, status="failed", raw_output={"error": str(exc)})
        raise
    await turn.update_tool(
        call, status="completed", raw_output={"path": path, "bytes": len(new_text.encode())}
    )
    return True, path


async def run_approve(turn: Turn) -> None:
    await turn.say(f"I need to write {APPROVE_FILE}; asking for permission.")
    allowed, _ = await _guarded_write(
        turn,
        filename=APPROVE_FILE,
        new_text="Approved by the user via the hermesweb demo agent.\n",
        old_text=None,
        title=f"Write {APPROVE_FILE}",
    )
    await turn.say(f"\n\nApproved: wrote {APPROVE_FILE}" if allowed else "\n\nDenied: nothing written")


async def run_edit(turn: Turn) -> None:
    path = Path(turn.cwd) / EDIT_FILE
    try:
        old_text: str | None = path.read_text(encoding="utf-8")
    except OSError:
        old_text = None
    new_text = (old_text or "") + "Hello from the hermesweb demo agent.\n"
    await turn.say(f"I will edit {EDIT_FILE}; here is the diff.")
    allowed, _ = await _guarded_write(
        turn, filename=EDIT_FILE, new_text=new_text, old_text=old_text, title=f"Edit {EDIT_FILE}"
    )
    await turn.say(
        f"\n\nEdited {EDIT_FILE}" if allowed else f"\n\nDenied: {EDIT_FILE} left untouched, nothing written"
    )


async def run_plan(turn: Turn) -> None:
    steps = ["Read the request", "Draft the answer", "Review the result"]
    statuses: list[PlanEntryStatus] = ["pending"] * len(steps)

    async def send() -> None:
        await turn.plan(list(zip(steps, statuses, strict=True)))

    await send()
    await turn.say("Here is my plan.")
    for index, step in enumerate(steps):
        statuses[index] = "in_progress"
        await send()
        await turn.say(f"\n\nStep {index + 1}: {step.lower()}… done.")
        statuses[index] = "completed"
        await send()
    await turn.say("\n\nAll three steps are complete.")


async def run_ask(turn: Turn) -> None:
    if not turn.client_supports_form_elicitation():
        await turn.say(
            "I wanted to ask which colour to use, but this client does not support form elicitation, "
            "so I cannot ask. Ending the turn."
        )
        return
    await turn.say("I need one detail from you before I continue.")
    try:
        answer = await turn.elicit_text(
            ASK_QUESTION, prop="answer", title="Colour", description="Any colour name, e.g. teal"
        )
    except RequestError as exc:
        await turn.say(f"\n\nThe client refused the question ({exc}), so I will continue without it.")
        return
    value = (
        answer.content.get("answer")
        if isinstance(answer, AcceptElicitationResponse) and answer.content
        else None
    )
    if isinstance(value, str) and value.strip():
        await turn.say(f"\n\nYou answered: {value}")
    else:
        await turn.say("\n\nNo answer given.")


async def run_slow(turn: Turn) -> None:
    delay = max(turn.delay, SLOW_MIN_DELAY)
    for index in range(1, SLOW_CHUNKS + 1):
        await turn.say_chunk(f"Slow chunk {index}. ", delay=delay)
    await turn.say_chunk("\n\nFinished the slow run.", delay=0)


def hold_bound_seconds() -> float:
    raw = os.environ.get(HOLD_MAX_SECONDS_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return HOLD_MAX_SECONDS
    return value if value > 0 else HOLD_MAX_SECONDS


def take_release(cwd: str) -> bool:
    """True once the release file exists; it is removed so the next `hold` waits again."""
    path = Path(cwd) / HOLD_RELEASE_FILE
    if not path.exists():
        return False
    # Released all the same if it cannot be removed: that must not hold the turn forever.
    with contextlib.suppress(OSError):
        path.unlink()
    return True


async def run_hold(turn: Turn) -> None:
    delay = max(turn.delay, HOLD_POLL_SECONDS)
    deadline = time.monotonic() + hold_bound_seconds()
    index = 0
    while True:
        if take_release(turn.cwd):
            ending = f"\n\nReleased after {index} held chunks."
            break
        if time.monotonic() >= deadline:
            ending = f"\n\nNot released within {hold_bound_seconds():g} s; finished by itself."
            break
        index += 1
        await turn.say_chunk(f"Held chunk {index}. ", delay=delay)
    await turn.say_chunk(ending, delay=0)


async def run_recall(turn: Turn) -> None:
    # The session's own memory: a forked or reloaded session recalls what its history holds.
    stored = turn.live.stored
    stored.seal()
    prompts = [
        entry["content"].get("text", "")
        for entry in stored.history
        if entry.get("sessionUpdate") == "user_message_chunk" and isinstance(entry.get("content"), dict)
    ]
    earlier = prompts[:-1]  # the last is this turn's own prompt
    if earlier:
        await turn.say(f"Your previous prompt was: {earlier[-1]}")
    else:
        await turn.say("This session has no earlier prompt to recall.")


async def run_crash(turn: Turn) -> None:
    await turn.say("Crashing now, as requested.", delay=0)
    turn.crash(3)


async def run_toolloop(turn: Turn) -> None:
    await turn.say(f"Running {TOOLLOOP_STEPS} checks in a row.")
    for step in range(1, TOOLLOOP_STEPS + 1):
        command = f"check --step {step}"
        call = await turn.start_tool(
            f"Run check {step}", kind="execute", status="in_progress", raw_input={"command": command}
        )
        await turn.pause(TOOLLOOP_STEP_SECONDS)
        output = f"check {step}: ok"
        await turn.update_tool(call, content=[tool_content(text_block(output))])
        await turn.update_tool(call, status="completed", raw_output={"exit_code": 0, "stdout": output})
        await turn.say(f"\n\nCheck {step} passed.")
    await turn.say("\n\nAll checks passed.")


# Test-only: `shell <command>` runs a real command, so the sandbox tests can try what an agent's
# tools could do. Off unless the agent's environment sets it: the demo agent is the quick start's.
SHELL_ENV = "HERMESWEB_DEMO_SHELL"
SHELL_TIMEOUT = 30.0


async def run_shell(turn: Turn) -> None:
    text = turn.prompt_text
    command = text[text.lower().index("shell") + len("shell") :].strip()
    call = await turn.start_tool(
        f"sh: {command}", kind="execute", status="in_progress", raw_input={"command": command}
    )
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        cwd=turn.cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), SHELL_TIMEOUT)
    except TimeoutError:
        process.kill()
        out = b"(timed out)"
    output = out.decode(errors="replace")
    await turn.update_tool(call, content=[tool_content(text_block(output))])
    status = "completed" if process.returncode == 0 else "failed"
    await turn.update_tool(
        call, status=status, raw_output={"exit_code": process.returncode, "stdout": output}
    )
    await turn.say(f"exit {process.returncode}")


# Order only matters for documentation; selection uses the first trigger word in the prompt.
TRIGGERS: dict[str, Script] = {
    "think": run_think,
    "tool": run_tool,
    "edit": run_edit,
    "approve": run_approve,
    "permission": run_approve,
    "plan": run_plan,
    "ask": run_ask,
    "clarify": run_ask,
    "slow": run_slow,
    "hold": run_hold,
    "crash": run_crash,
    "toolloop": run_toolloop,
    "recall": run_recall,
}
TRIGGERS.update(CLIENT_TRIGGERS)  # the client's files and terminals (client_scripts.py)
if os.environ.get(SHELL_ENV) == "1":
    TRIGGERS["shell"] = run_shell


def pick_script(text: str) -> tuple[str, Script]:
    """Return (trigger word or "default", script) for the first trigger word in the prompt."""
    for word in prompt_words(text):
        script = TRIGGERS.get(word)
        if script is not None:
            return word, script
    return "default", run_default
