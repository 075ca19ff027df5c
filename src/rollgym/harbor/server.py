"""``impl: harbor``: a directory of Harbor tasks served as a resources server.

    servers:
      tasks: {kind: resources, impl: harbor, options: {tasks_dir: path/to/tasks}}

A row names its task (``{"harbor": {"task": NAME}}``, as ``task_rows`` writes it); the task is
looked up in ``tasks_dir`` only. ``/seed_session`` starts the task's agent container (``trial``);
the tools act in it: ``run_command`` (a deadline, bounded output, the exit status),
``read_file``, ``write_file``, ``edit_file``. ``/verify`` ends the agent phase and runs the
verifier in a fresh container (``trial.Trial.verify``): its reward is the rollout's. The
session's containers are removed at its verdict, at shutdown, or by the reaper once their lease
runs out (a rollout abandoned without a verify); a verify cancelled or failed may be retried.

The tools take the session's container and nothing else: the model sees the instruction and
what the tools answer, and no tool reaches the task's tests or solution.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from rollgym.containers.lease import Reaper, new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.runtime import Runtime
from rollgym.errors import ConfigError, InvalidRequest, SandboxError
from rollgym.harbor.image import prepare
from rollgym.harbor.task import HARBOR_ROW, HarborTask, load_tasks
from rollgym.harbor.trial import Prepared, Trial
from rollgym.server.base import ServerContext
from rollgym.server.resources import ResourcesServer, Session, tool

log = logging.getLogger("rollgym.harbor")

TRIAL = "harbor_trial"
LEASE_MARGIN = 300.0
"""Seconds a trial's lease outlives its agent and verifier timeouts (container starts, copies)."""
PREPARED_LEASE = 7 * 24 * 3600.0
"""A prepared image lives as long as the server that made it (its owner): the deadline is a
backstop only."""


class HarborEnv(ResourcesServer):
    """Harbor tasks in containers: a terminal agent's tools, and a verifier it cannot reach."""

    row_fields = frozenset({HARBOR_ROW})
    reverify_mode = "unsupported"  # the verifier reads the container the session held
    verify_timeout = 3600.0

    class Options(ResourcesServer.Options):
        tasks_dir: str = Field(description="a directory of Harbor tasks (one per subdirectory)")
        max_output: int = Field(
            default=16384, ge=256, le=1 << 20, description="bytes of a command's output kept"
        )
        command_timeout: float = Field(
            default=600.0, gt=0, description="the longest one run_command may take, seconds"
        )
        run: str | None = Field(
            default=None, description="the run named on the containers' leases (default: the "
            "server's name and pid)",
        )  # fmt: skip

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        # A relative directory is the server process's working directory's (the launcher's).
        directory = Path(self.options.tasks_dir).absolute()
        self.tasks: dict[str, HarborTask] = {t.name: t for t in load_tasks(directory)}
        self.runtime: Runtime = PodmanRuntime()
        self.run_name = self.options.run or f"{self.name}-{os.getpid()}"
        self._prepared: dict[str, asyncio.Task[Prepared]] = {}
        self._trials: set[Trial] = set()
        self._reaper: Reaper | None = None

    async def startup(self) -> None:
        await super().startup()
        self._reaper = Reaper(self.runtime)
        await self._reaper.start()

    async def shutdown(self) -> None:
        for trial in list(self._trials):
            await trial.close()
        if self._reaper is not None:
            await self._reaper.stop()
        await super().shutdown()

    # -- sessions ---------------------------------------------------------------------------

    def task_named(self, row: dict[str, Any]) -> HarborTask:
        named = row.get(HARBOR_ROW)
        name = named.get("task") if isinstance(named, dict) else None
        if not isinstance(name, str) or name not in self.tasks:
            raise InvalidRequest(
                f"row names no task of {self.options.tasks_dir} (its '{HARBOR_ROW}.task': "
                f"{name!r:.80})",
                status=422,
            )
        return self.tasks[name]

    async def prepared(self, task: HarborTask) -> Prepared:
        """The task's prepared image (made once; a failed preparation is tried again)."""
        job = self._prepared.get(task.name)
        if job is None or (job.done() and (job.cancelled() or job.exception() is not None)):
            lease = new_lease(self.run_name, PREPARED_LEASE)
            job = asyncio.ensure_future(prepare(task, self.runtime, lease))
            self._prepared[task.name] = job
        return await asyncio.shield(job)

    async def seed_session(self, session: Session) -> None:
        task = self.task_named(session.task)
        await self._forget_abandoned()
        prepared = await self.prepared(task)
        seconds = task.agent_timeout + task.config.verifier.timeout_sec + LEASE_MARGIN
        trial = Trial(prepared, self.runtime, new_lease(self.run_name, seconds))
        self._trials.add(trial)
        try:
            await trial.start()
        except BaseException:
            self._trials.discard(trial)
            await trial.close()
            raise
        session.data[TRIAL] = trial
        session.data["agent_deadline"] = time.monotonic() + task.agent_timeout

    async def _forget_abandoned(self) -> None:
        """Close the trials of sessions never verified whose lease has run out (the reaper
        removes their containers anyway; this drops them from memory)."""
        now = time.time()
        for trial in [t for t in self._trials if t.lease.deadline < now]:
            self._trials.discard(trial)
            await trial.close()

    def _trial(self, session: Session) -> Trial:
        trial = session.data.get(TRIAL)
        if not isinstance(trial, Trial) or trial.agent is None:
            raise InvalidRequest("no container in this session (seed it first)", status=409)
        return trial

    def _left(self, session: Session, asked: float) -> float:
        """Seconds a command may take: what it asked, within the server's bound and what is
        left of the agent's time."""
        left = float(session.data.get("agent_deadline", 0.0)) - time.monotonic()
        if left <= 0:
            raise InvalidRequest("the agent's time for this task is up", status=422)
        return max(0.1, min(asked, self.options.command_timeout, left))

    # -- tools ------------------------------------------------------------------------------

    @tool
    async def run_command(
        self, session: Session, command: str, timeout: float = 60.0, stdin: str | None = None
    ) -> dict[str, Any]:
        """Run a shell command (bash -c) in the task's container; its exit code and output
        (stdout and stderr, each cut at a bound). timeout: seconds before it is killed."""
        box = self._trial(session).agent
        assert box is not None
        ran = await box.exec(
            ["bash", "-c", command],
            timeout=self._left(session, timeout),
            max_output=self.options.max_output,
            stdin=stdin.encode() if stdin is not None else None,
        )
        out: dict[str, Any] = {
            "exit_code": ran.exit_code,
            "stdout": ran.stdout,
            "stderr": ran.stderr,
            "timed_out": ran.timed_out,
            "truncated": ran.truncated,
        }
        if ran.disk_exceeded:
            # The container was ended past storage_mb: every command from now on says so.
            out["disk_exceeded"] = True
        return out

    @tool
    async def read_file(self, session: Session, path: str) -> dict[str, Any]:
        """The text of a file in the task's container (cut at a bound)."""
        box = self._trial(session).agent
        assert box is not None
        ran = await box.exec(
            ["cat", "--", path], timeout=self._left(session, 30.0),
            max_output=self.options.max_output,
        )  # fmt: skip
        if ran.exit_code != 0:
            raise InvalidRequest(f"read_file {path!r:.200}: {ran.stderr.strip()[:300]}")
        return {"path": path, "content": ran.stdout, "truncated": ran.truncated}

    @tool
    async def write_file(self, session: Session, path: str, content: str) -> dict[str, Any]:
        """Write a file in the task's container (its directories made), replacing it."""
        await self._write(session, path, content)
        return {"path": path, "bytes": len(content.encode())}

    @tool
    async def edit_file(
        self, session: Session, path: str, old: str, new: str, count: int = 1
    ) -> dict[str, Any]:
        """Replace text in a file of the task's container: ``old`` must occur exactly
        ``count`` times (default once)."""
        box = self._trial(session).agent
        assert box is not None
        limit = 4 << 20
        ran = await box.exec(
            ["cat", "--", path], timeout=self._left(session, 30.0), max_output=limit
        )
        if ran.exit_code != 0:
            raise InvalidRequest(f"edit_file {path!r:.200}: {ran.stderr.strip()[:300]}")
        if ran.truncated:
            raise InvalidRequest(f"edit_file {path!r:.200}: larger than {limit} bytes")
        if not old:
            raise InvalidRequest("edit_file: 'old' is empty")
        found = ran.stdout.count(old)
        if found != count:
            raise InvalidRequest(
                f"edit_file {path!r:.200}: 'old' occurs {found} times, not {count}"
            )
        # The result is bounded before it is built: 'a' -> 2,000 chars, 4 M times, would be an
        # 8 GB string in this shared server.
        size = len(ran.stdout) + count * (len(new) - len(old))
        if size > limit:
            raise InvalidRequest(
                f"edit_file {path!r:.200}: the result, {size} chars, is over {limit}"
            )
        await self._write(session, path, ran.stdout.replace(old, new))
        return {"path": path, "replaced": count}

    async def _write(self, session: Session, path: str, content: str) -> None:
        box = self._trial(session).agent
        assert box is not None
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        ran = await box.exec(
            ["sh", "-c", script, "sh", path], timeout=self._left(session, 30.0),
            stdin=content.encode(),
        )  # fmt: skip
        if ran.exit_code != 0:
            raise InvalidRequest(f"write {shlex.quote(path)[:200]}: {ran.stderr.strip()[:300]}")

    # -- verify -----------------------------------------------------------------------------

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        trial = session.data.get(TRIAL)
        if not isinstance(trial, Trial):
            raise InvalidRequest(
                "verify: this session ran no container (seed it first)", status=409
            )
        # Only a verdict ends the trial: a verify cancelled or failed keeps the agent's changes,
        # so a retry runs the verifier again rather than meeting a closed trial (what is never
        # retried is closed with its lease, ``_forget_abandoned``).
        verdict = await trial.verify()
        await trial.close()
        self._trials.discard(trial)
        return {**verdict.fields(), "harbor_task": trial.task.name}


def check_runtime() -> None:
    """A clear error when podman is missing (the harbor environment needs it)."""
    if not PodmanRuntime.available():
        raise ConfigError("the harbor environment runs tasks in podman containers: install podman")


__all__ = ["HarborEnv", "SandboxError"]
