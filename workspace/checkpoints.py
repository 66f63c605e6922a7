"""The runner's side of checkpoints: one at each run's start and end, out of the first token's way.

Design note: docs/workspace.md. `RunCheckpoints.begin()` starts the start snapshot as the
execution starts, beside the agent's start and session opening (git in a thread of its own; the
database through asgiref's database thread, like the runner's other reads, in one read and one
insert, neither of them waited for by the prompt); `before_prompt()` waits for the snapshot
alone, just before the prompt is sent, so it holds the tree before the agent can edit anything;
`end()` takes the end checkpoint before the run's terminal event is written. None of it ever
fails a turn: a failure is logged and the run goes on without that checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import acp
from asgiref.sync import sync_to_async

from workspace import conf, services
from workspace.store import Snapshot, Store, StoreError, TooLarge

log = logging.getLogger(__name__)

# The prompt waits this long at most for the start checkpoint: a project's first one hashes every
# file (seconds for 100 MB). Past it the turn goes on and the checkpoint lands a little late (an
# agent rarely edits within its model's first seconds); an unchanged tree takes milliseconds.
START_WAIT_SECONDS = 5.0
# Projects whose checkpoints are off, as this process last read: their tree is not walked
# before the database says so again (each run's read keeps it current).
OFF: set[int] = set()


class RunCheckpoints:
    def __init__(self, *, run_id: int, session_id: int, project_id: int, cwd: str) -> None:
        self.run_id, self.session_id, self.project_id, self.cwd = run_id, session_id, project_id, cwd
        self.facts: asyncio.Future[services.TurnFacts] | None = None
        self.captured: asyncio.Future[Snapshot | TooLarge | None] | None = None
        self.start: asyncio.Future[bool] | None = None  # the start row was recorded

    def begin(self) -> None:
        """Start the start checkpoint; the agent starts meanwhile."""
        if self.start is not None or not conf.enabled():
            return
        self.facts = asyncio.ensure_future(
            sync_to_async(services.turn_facts)(
                run_id=self.run_id, session_id=self.session_id, project_id=self.project_id
            )
        )
        self.captured = asyncio.ensure_future(self.snapshot(skip_off=True))
        self.start = asyncio.ensure_future(self.record_start())

    async def before_prompt(self) -> str:
        """Wait for the start snapshot; a notice for the journal when checkpoints just went off."""
        if self.captured is None:
            return ""
        try:
            captured = await asyncio.wait_for(asyncio.shield(self.captured), START_WAIT_SECONDS)
        except TimeoutError:
            log.warning(
                "run %s: start checkpoint slower than %ss, not waited for", self.run_id, START_WAIT_SECONDS
            )
            return ""
        return str(captured) if isinstance(captured, TooLarge) else ""

    async def prompt_note(self) -> list[acp.schema.TextContentBlock]:
        """A text block for the prompt, before the user's, when files were restored since the
        agent's last turn (its context still remembers what they held); else none."""
        if self.facts is None:
            return []
        try:
            facts = await asyncio.wait_for(asyncio.shield(self.facts), START_WAIT_SECONDS)
        except Exception:
            log.exception("run %s: reading the restored files failed", self.run_id)
            return []
        return [acp.text_block(facts.note)] if facts.note else []

    async def end(self) -> None:
        """The end checkpoint, once, when the start one was recorded."""
        start, self.start = self.start, None
        if start is None or not await start:
            return
        snapshot = await self.snapshot(skip_off=False)
        if isinstance(snapshot, Snapshot):
            await self.record("end", snapshot)

    # ------------------------------------------------------------ steps

    async def snapshot(self, *, skip_off: bool) -> Snapshot | TooLarge | None:
        """The tree now; TooLarge over the caps; None when skipped or failed (logged)."""
        if skip_off and self.project_id in OFF:
            return None
        try:
            return await asyncio.to_thread(Store(self.project_id, self.cwd).snapshot)
        except TooLarge as exc:
            return exc
        except StoreError as exc:  # the project cannot be opened (the turn says why) or git failed
            log.warning("run %s: no checkpoint: %s", self.run_id, exc)
            return None
        except Exception:
            log.exception("run %s: a checkpoint's snapshot failed", self.run_id)
            return None

    async def record_start(self) -> bool:
        assert self.facts is not None and self.captured is not None
        try:
            facts = await self.facts
        except Exception:
            log.exception("run %s: reading the checkpoint state failed", self.run_id)
            return False
        if facts.off:
            OFF.add(self.project_id)  # a snapshot already begun is dropped
            return False
        OFF.discard(self.project_id)
        captured = await self.captured
        if isinstance(captured, TooLarge):
            OFF.add(self.project_id)
            await self.guarded(sync_to_async(services.turn_checkpoints_off)(self.project_id, str(captured)))
            return False
        if captured is None:
            return False
        return await self.record("start", captured)

    async def record(self, kind: str, snapshot: Snapshot) -> bool:
        return await self.guarded(
            sync_to_async(services.record_checkpoint)(
                run_id=self.run_id,
                session_id=self.session_id,
                project_id=self.project_id,
                kind=kind,
                snapshot=snapshot,
            )
        )

    async def guarded(self, step: Awaitable[object]) -> bool:
        """Await a database step; False (logged) when it failed: a checkpoint never fails a turn."""
        try:
            await step
        except Exception:
            log.exception("run %s: recording a checkpoint failed", self.run_id)
            return False
        return True
