"""Leases: who owns a container or image, written on it as labels, and whether that owner lives.

A lease names its run, the owner's pid with the owner's start time (``/proc/<pid>/stat``'s
clock ticks since boot, with the boot's id: a pid reused by another process, or one from before
a reboot, is no owner) and a deadline. Anything whose owner is gone or whose deadline has passed
is an orphan, and the reaper (``Reaper``, or a provider's ``reap()``) removes it: at start, and
every few seconds while a run goes on. Nothing here talks to a provider; the labels are plain
strings, so any provider that keeps labels can carry a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rollgym.containers.runtime import Lease

if TYPE_CHECKING:
    from rollgym.containers.runtime import Runtime

log = logging.getLogger(__name__)

MARK = "rollgym.lease"
"""The label every leased container and image carries (the reaper's filter)."""
RUN = "rollgym.run"
OWNER_PID = "rollgym.owner_pid"
OWNER_START = "rollgym.owner_start"
DEADLINE = "rollgym.deadline"
HOST = "rollgym.host"


def boot_id() -> str:
    """This boot's id: a pid from another boot names no process of this one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """``<boot id>:<start ticks>`` of process ``pid``, or None when there is no such live
    process (gone, or a zombie: killed and only waiting for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: read past its last ')'.
    rest = stat[stat.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return f"{boot_id()}:{rest[19]}"


def owner_token(pid: int | None = None) -> str:
    """``<pid>-<start ticks>`` of ``pid`` (this process by default): written into the names of
    what podman may leave without labels (a container killed mid-create, a build's working
    container), so the reaper can still tell whether its owner lives."""
    pid = os.getpid() if pid is None else pid
    started = process_start(pid) or ":0"
    return f"{pid}-{started.rsplit(':', 1)[1]}"


_TOKEN_NAME = re.compile(r"^rollgym-(?:build-)?(\d+)-(\d+)-")


def name_owner_gone(name: str) -> bool:
    """Whether ``name`` carries an owner token (``owner_token``) whose process is gone. A name
    without one is never judged gone: it is not ours to remove."""
    match = _TOKEN_NAME.match(name)
    if match is None:
        return False
    started = process_start(int(match.group(1)))
    return started is None or started.rsplit(":", 1)[1] != match.group(2)


def new_lease(run: str, seconds: float, *, pid: int | None = None) -> Lease:
    """A lease for ``run`` owned by ``pid`` (this process by default), ending ``seconds`` from
    now."""
    pid = os.getpid() if pid is None else pid
    return Lease(
        run=run,
        owner_pid=pid,
        deadline=time.time() + seconds,
        host=socket.gethostname(),
        owner_start=process_start(pid) or "",
    )


def to_labels(lease: Lease) -> dict[str, str]:
    """The labels that carry ``lease``; the owner's start time is read now when it lacks one."""
    if not lease.owner_start:
        lease = replace(lease, owner_start=process_start(lease.owner_pid) or "")
    return {
        MARK: "1",
        RUN: lease.run,
        OWNER_PID: str(lease.owner_pid),
        OWNER_START: lease.owner_start,
        DEADLINE: repr(float(lease.deadline)),
        HOST: lease.host or socket.gethostname(),
    }


def from_labels(labels: Mapping[str, str] | None) -> Lease | None:
    """The lease ``labels`` carry, or None when they carry none. Unreadable numbers make a
    lease that is already over (pid 0, deadline 0): a label nobody could have written is no
    reason to keep a container."""
    if not labels or MARK not in labels:
        return None
    try:
        pid = int(labels.get(OWNER_PID, "0"))
        deadline = float(labels.get(DEADLINE, "0"))
    except ValueError:
        pid, deadline = 0, 0.0
    return Lease(
        run=labels.get(RUN, ""),
        owner_pid=pid,
        deadline=deadline,
        host=labels.get(HOST, ""),
        owner_start=labels.get(OWNER_START, ""),
    )


def owner_alive(lease: Lease) -> bool:
    """Whether the lease's owner still runs. An owner on another host cannot be seen from here:
    it counts as alive, and only its deadline ends the lease."""
    if lease.host and lease.host != socket.gethostname():
        return True
    if lease.owner_pid <= 0:
        return False
    started = process_start(lease.owner_pid)
    if started is None:
        return False
    # Without a recorded start time (a lease from an older writer), the pid alone decides.
    return not lease.owner_start or lease.owner_start == started


def orphan_reason(lease: Lease, *, now: float | None = None) -> str | None:
    """Why a thing under ``lease`` may be removed (its deadline passed, its owner is gone), or
    None when it must be kept."""
    now = time.time() if now is None else now
    if lease.deadline <= now:
        return "past its deadline"
    if not owner_alive(lease):
        return f"its owner (pid {lease.owner_pid}) is gone"
    return None


EARLY_PASSES = (1.5, 3.0)
"""Seconds after its start at which a ``Reaper`` looks again before settling to its interval: a
collector SIGKILLed just before this run started has servers that take about a second to
notice and end (``lifeline``: SIGTERM, then their shutdown), and what they own is kept while
they live. Measured by ``bench/harbor_kills.py``."""


class Reaper:
    """Calls ``runtime.reap()`` now, again at ``early`` seconds after that, then every
    ``interval`` seconds until stopped, so what a crashed run left behind goes away while this
    one runs. A failing reap is logged, never raised: the reaper must not take a run down."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        interval: float = 30.0,
        early: tuple[float, ...] = EARLY_PASSES,
        on_reaped: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.interval = interval
        self.early = early
        self.on_reaped = on_reaped
        self._task: asyncio.Task[None] | None = None

    async def reap_once(self) -> list[str]:
        try:
            removed = await self.runtime.reap()
        except Exception as exc:  # logged: a reap failure is no run failure
            log.warning("reaping %s containers failed: %s", self.runtime.name, exc)
            return []
        if removed:
            log.info("reaped %d orphaned %s containers/images", len(removed), self.runtime.name)
            if self.on_reaped is not None:
                self.on_reaped(removed)
        return removed

    async def _loop(self) -> None:
        waited = 0.0
        for at in self.early:
            await asyncio.sleep(max(at - waited, 0.0))
            waited = at
            await self.reap_once()
        while True:
            await asyncio.sleep(self.interval)
            await self.reap_once()

    async def start(self) -> list[str]:
        """Reap once (what earlier runs left), then keep reaping in the background."""
        removed = await self.reap_once()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="rollgym-reaper")
        return removed

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> Reaper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
