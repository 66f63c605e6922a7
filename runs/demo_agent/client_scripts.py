"""Demo scripts that use the client's side of ACP: its files (fs/*) and its terminals (terminal/*).

`readfile PATH [line N] [limit M]`, `writefile PATH TEXT…` (asks permission first, as an agent's
own edit tool does) and `terminal [limit=N] [leave] COMMAND…` (the client runs COMMAND; `leave`
ends the turn without waiting, so the client must release it). A relative PATH is joined to the
session's cwd as written — `..` included — so tests can try escapes through the client.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from acp import RequestError
from acp.helpers import text_block, tool_content, tool_diff_content, tool_terminal_ref
from acp.schema import ToolCallLocation

from .turn import Turn, TurnCancelled


def _after(text: str, word: str) -> str:
    """The prompt's raw text after the trigger word (case kept)."""
    match = re.search(rf"\b{word}\b", text, re.IGNORECASE)
    return text[match.end() :].strip() if match else ""


def _path(turn: Turn, name: str) -> str:
    return name if name.startswith("/") else f"{turn.cwd.rstrip('/')}/{name}"


async def _client_call(turn: Turn, awaitable: Any) -> Any:
    """A request to the client that a Stop ends (the turn is cancelled, not the request answered)."""
    request = asyncio.ensure_future(awaitable)
    cancelled = asyncio.ensure_future(turn.cancel_event.wait())
    try:
        done, _ = await asyncio.wait({request, cancelled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in (request, cancelled):
            if not future.done():
                future.cancel()
    if request in done:
        return request.result()
    raise TurnCancelled


def _caps(turn: Turn) -> Any:
    return turn.client_capabilities


async def run_readfile(turn: Turn) -> None:
    words = _after(turn.prompt_text, "readfile").split()
    if not words:
        await turn.say("Name a file to read.")
        return
    path = _path(turn, words[0])
    options = dict(zip(words[1::2], words[2::2], strict=False))
    line = int(options["line"]) if options.get("line", "").isdigit() else None
    limit = int(options["limit"]) if options.get("limit", "").isdigit() else None
    caps = _caps(turn)
    if caps is None or not caps.fs or not caps.fs.read_text_file:
        await turn.say("This client does not offer fs/read_text_file.")
        return
    call = await turn.start_tool(
        f"Read {words[0]}",
        kind="read",
        status="in_progress",
        raw_input={"path": path, "line": line, "limit": limit},
        locations=[ToolCallLocation(path=path)],
    )
    try:
        response = await _client_call(
            turn, turn.conn.read_text_file(session_id=turn.session_id, path=path, line=line, limit=limit)
        )
    except RequestError as exc:
        await turn.update_tool(call, status="failed", raw_output={"error": str(exc), "code": exc.code})
        await turn.say(f"read refused: {exc.code} {exc}")
        return
    await turn.update_tool(call, content=[tool_content(text_block(response.content))])
    await turn.update_tool(call, status="completed", raw_output={"chars": len(response.content)})
    await turn.say(f"read {len(response.content)} chars:\n\n```\n{response.content}```")


async def run_writefile(turn: Turn) -> None:
    rest = _after(turn.prompt_text, "writefile")
    name, _, text = rest.partition(" ")
    if not name:
        await turn.say("Name a file to write.")
        return
    caps = _caps(turn)
    if caps is None or not caps.fs or not caps.fs.write_text_file:
        await turn.say("This client does not offer fs/write_text_file.")
        return
    path, content = _path(turn, name), text + "\n"
    call = await turn.start_tool(
        f"Write {name}",
        kind="edit",
        status="pending",
        raw_input={"path": path, "content": content},
        content=[tool_diff_content(path, content, None)],
        locations=[ToolCallLocation(path=path)],
    )
    if not await turn.ask_permission(call, f"Write {name}", memory_key="write_file"):
        await turn.update_tool(call, status="failed", raw_output={"error": "denied by user"})
        await turn.say("Denied: nothing written")
        return
    await turn.update_tool(call, status="in_progress")
    try:
        await _client_call(
            turn, turn.conn.write_text_file(session_id=turn.session_id, path=path, content=content)
        )
    except RequestError as exc:
        await turn.update_tool(call, status="failed", raw_output={"error": str(exc), "code": exc.code})
        await turn.say(f"write refused: {exc.code} {exc}")
        return
    await turn.update_tool(
        call, status="completed", raw_output={"path": path, "bytes": len(content.encode())}
    )
    await turn.say(f"wrote {name}")


async def run_terminal(turn: Turn) -> None:
    words = _after(turn.prompt_text, "terminal").split(" ")
    limit, leave = None, False
    while words and (words[0].startswith("limit=") or words[0] == "leave"):
        word = words.pop(0)
        if word == "leave":
            leave = True
        else:
            limit = int(word.removeprefix("limit="))
    command = " ".join(words).strip()
    caps = _caps(turn)
    if caps is None or not caps.terminal:
        await turn.say("This client does not offer terminals.")
        return
    try:
        created = await _client_call(
            turn,
            turn.conn.create_terminal(session_id=turn.session_id, command=command, output_byte_limit=limit),
        )
    except RequestError as exc:
        await turn.say(f"terminal refused: {exc.code} {exc}")
        return
    terminal_id = created.terminal_id
    call = await turn.start_tool(
        f"$ {command}",
        kind="execute",
        status="in_progress",
        raw_input={"command": command},
        content=[tool_terminal_ref(terminal_id)],
    )
    if leave:
        await turn.say(f"left {terminal_id} running")
        return
    exited = await _client_call(
        turn, turn.conn.wait_for_terminal_exit(session_id=turn.session_id, terminal_id=terminal_id)
    )
    output = await _client_call(
        turn, turn.conn.terminal_output(session_id=turn.session_id, terminal_id=terminal_id)
    )
    status = "completed" if exited.exit_code == 0 else "failed"
    await turn.update_tool(
        call, status=status, raw_output={"exit_code": exited.exit_code, "signal": exited.signal}
    )
    await _client_call(turn, turn.conn.release_terminal(session_id=turn.session_id, terminal_id=terminal_id))
    await turn.say(
        f"exit {exited.exit_code} signal {exited.signal} truncated {output.truncated} "
        f"output {len(output.output.encode())} bytes: {output.output[-200:]!r}"
    )


CLIENT_TRIGGERS = {"readfile": run_readfile, "writefile": run_writefile, "terminal": run_terminal}
