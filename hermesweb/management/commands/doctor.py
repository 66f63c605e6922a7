"""`python manage.py doctor`: check the installation and say what to fix."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runs.agents import AgentSpec


class Command(BaseCommand):
    help = (
        "Check the database (reachable, migrated), the channel layer (Redis reachable, or polling), "
        "each configured agent (command found, ACP initialize answers, in its sandbox), the agent "
        "sandbox (bubblewrap), the allowed project roots, the data directory's modes (owner-only), and "
        "the runners' heartbeats. Prints what to fix; exits non-zero if anything is broken."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--skip-agents", action="store_true", help="Do not start the agents.")
        parser.add_argument("--agent-timeout", type=float, default=30.0)

    def handle(self, *args: Any, skip_agents: bool, agent_timeout: float, **options: Any) -> None:
        self.failures = 0
        self.check_database()
        self.check_channel_layer()
        self.check_roots()
        self.check_data_dir()
        self.check_sandbox()
        self.check_runners()
        if not skip_agents:
            for spec in settings.HERMESWEB_AGENTS.values():
                self.check_agent(spec, agent_timeout)
        if self.failures:
            raise CommandError(f"{self.failures} problem(s) found")
        self.stdout.write(self.style.SUCCESS("all checks passed"))

    def ok(self, message: str) -> None:
        self.stdout.write(f"✓ {message}")

    def bad(self, message: str, fix: str) -> None:
        self.failures += 1
        self.stdout.write(self.style.ERROR(f"✗ {message}") + f"\n    fix: {fix}")

    def warn(self, message: str, fix: str) -> None:
        self.stdout.write(self.style.WARNING(f"! {message}") + f"\n    hint: {fix}")

    def check_database(self) -> None:
        vendor = connection.vendor
        try:
            connection.ensure_connection()
        except Exception as exc:
            self.bad(f"database ({vendor}) unreachable: {exc}", "check DATABASE_URL and that the server runs")
            return
        plan = MigrationExecutor(connection).migration_plan(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )
        if plan:
            self.bad(
                f"database ({vendor}) has {len(plan)} unapplied migration(s)", "python manage.py migrate"
            )
        else:
            self.ok(f"database ({vendor}) reachable and migrated")

    def check_channel_layer(self) -> None:
        if not settings.REDIS_URL:
            self.ok("channel layer: none (embedded default; consumers and runners poll the database)")
            return
        import redis

        try:
            redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3).ping()
        except Exception as exc:
            self.bad(f"Redis at {settings.REDIS_URL} unreachable: {exc}", "start Redis or fix REDIS_URL")
        else:
            self.ok(f"channel layer: Redis at {settings.REDIS_URL}")

    def check_roots(self) -> None:
        for root in settings.HERMESWEB_ALLOWED_ROOTS:
            if not root.is_dir():
                self.bad(f"allowed root {root} is missing", "create it or fix HERMESWEB_ALLOWED_ROOTS")
            elif not os.access(root, os.R_OK | os.X_OK):
                self.bad(f"allowed root {root} is not readable", "fix its permissions")
            else:
                self.ok(f"allowed root {root}")

    def check_data_dir(self) -> None:
        from hermesweb.data_dir import settings_warnings

        loose = settings_warnings(deep=True)
        if not loose:
            self.ok(f"data directory {settings.DATA_DIR}: owner-only")
            return
        # A warning, as an unsandboxed agent is: the service works, but others may read it.
        self.warn(
            f"data directory {settings.DATA_DIR}: modes wider than owner-only\n    " + "\n    ".join(loose),
            f"chmod -R go= {settings.DATA_DIR}",
        )

    def check_sandbox(self) -> None:
        from runs import agents
        from runs.runner.sandbox import hidden_paths

        found = agents.bwrap()
        if os.geteuid() == 0:
            from runs.runner.account import AgentAccountUnavailable, agent_account

            try:
                account = agent_account()
            except AgentAccountUnavailable as exc:
                self.bad(str(exc), "set HERMESWEB_AGENT_USER to an unprivileged account")
            else:
                self.warn(
                    f"hermesweb runs as root: agents start as {account.name!r} (uid {account.uid})"
                    if account
                    else "hermesweb runs as root",
                    "run the web and the runner as an unprivileged service user (deploy/systemd)",
                )
        if found.path:
            self.ok(f"agent sandbox: {found.version or 'bubblewrap'} at {found.path}")
        else:
            self.warn(
                f"agent sandbox unavailable: {found.problem}",
                "install Debian's bubblewrap (apt-get install bubblewrap), with user namespaces on",
            )
        try:
            hidden = hidden_paths()
        except ValueError as exc:
            self.bad(str(exc), "list absolute paths only")
        else:
            if found.path:
                self.ok(
                    "hidden from agents besides the data directory and the roots: "
                    + (", ".join(str(p) for p in hidden if p.exists()) or "nothing")
                )
        for spec in settings.HERMESWEB_AGENTS.values():
            ok, why = agents.sandboxed(spec)
            if ok:
                continue
            message = f"agent {spec.name!r} runs UNSANDBOXED ({why}): it can read the data directory"
            if spec.sandbox == "required":
                self.bad(f"agent {spec.name!r} requires the sandbox, and {why}", "install bubblewrap")
            elif spec.sandbox == "none":
                self.warn(message, "isolate it otherwise (see docs/security.md)")
            else:
                self.warn(message, "install bubblewrap")

    def check_runners(self) -> None:
        from runs.models import Runner

        alive = list(Runner.objects.alive())
        if alive:
            names = ", ".join(f"{r.id} (pid {r.pid}, heartbeat {r.heartbeat_at:%H:%M:%S})" for r in alive)
            self.ok(f"{len(alive)} runner(s) alive: {names}")
        else:
            self.warn("no runner is alive: queued runs will wait", "start one: python manage.py runner")
        self.check_placement(alive)

    def check_placement(self, alive: list[Any]) -> None:
        """Projects no live runner serves (labels, roots): their turns wait (docs/runner.md, Placement)."""
        from runs.placement import unserved_projects

        for runner in alive:
            labels = ", ".join(runner.labels or []) or "none"
            self.ok(f"runner {runner.id}: labels {labels}; roots {', '.join(runner.roots or []) or 'none'}")
        for project in unserved_projects():
            needs = f" with {', '.join(project.labels)}" if project.labels else ""
            self.warn(
                f"project {project.name!r} ({project.owner}) has no live runner{needs} "
                "serving its directory: its turns wait",
                f"start a runner{needs} whose HERMESWEB_ALLOWED_ROOTS hold it (docs/deploy.md)",
            )

    def check_agent(self, spec: AgentSpec, timeout: float) -> None:
        from projects.models import Project

        if spec.resolved_command() is None:
            message = f"agent {spec.name!r}: command {spec.command!r} not found"
            fix = "install it or fix HERMESWEB_AGENTS"
            if Project.objects.filter(agent=spec.name).exists():
                self.bad(message, fix)
            else:
                self.warn(message + " (no project uses it)", fix)
            return
        try:
            caps = asyncio.run(asyncio.wait_for(_initialize(spec), timeout))
        except Exception as exc:
            log = os.path.join(settings.HERMESWEB_LOG_DIR, f"agent-{spec.name}-project0.log")
            self.bad(f"agent {spec.name!r}: ACP initialize failed: {exc!r}", f"read {log}")
            return
        info = caps.get("agent_info", {})
        self.ok(
            f"agent {spec.name!r}: {info.get('name', '?')} {info.get('version', '')} "
            f"(load: {caps['load_session']}, steer: {caps['steer'] or 'no'}, "
            f"sandbox: {caps.get('sandbox', '?')})"
        )


async def _initialize(spec: AgentSpec) -> dict[str, Any]:
    from runs.runner.agents import AgentProcess, Placement

    # An empty project and state directory of its own: started as a runner would (sandboxed).
    with tempfile.TemporaryDirectory() as cwd, tempfile.TemporaryDirectory() as state:
        placement = Placement(Path(cwd).resolve(), Path(state).resolve())
        process = AgentProcess(spec, 0, cwd, placement)
        process.reports_to_catalog = False
        try:
            await process.start()
            return process.capabilities
        finally:
            await process.close()
