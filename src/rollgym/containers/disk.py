"""A disk limit that holds where the storage cannot cap a container: a watchdog.

podman caps a container's writable layer by construction only with project quotas under its
overlay storage (XFS ``pquota``); this host's kernel has neither XFS quotas nor ext4's quota
format, so ``--storage-opt size=`` is refused (``docs/concepts/containers.md``, "Disk"). Without
a cap, one ``fallocate -l 40G`` fills the host. So each container with ``Limits.disk_mb`` is
watched:

1. Every ``interval`` seconds (one asyncio task per runtime, started by the first ``watch``, ended
   when nothing is watched), each due container's writable layer (overlay's upper dir) is walked
   in a worker thread, without following symlinks, and charged what it holds on the disk:
   allocated blocks (``st_blocks * 512``, so ``fallocate`` counts in full and a sparse file
   only for what it holds), plus ``ENTRY_COST`` per entry (an empty file still takes an inode),
   each hard-linked inode once.
2. A walk stops at ``max_entries`` entries, as soon as the sum is past the limit, or at a path
   it cannot read (nested past ``PATH_MAX``, say). A walk that stops short of the limit for
   either of the other reasons judges the container over: a layer that cannot be measured is
   no layer that can be vouched for.
3. A container past its limit is marked (``Watched.exceeded``, with the reason) *before* it is
   killed, then every process in it is killed (its provider's ``kill``), and it is no longer
   watched. An exec that the kill ended, or one started after, answers
   ``ExecResult(disk_exceeded=True)``, and ``Container.disk_exceeded`` says so: the trial scores
   it 0 with a flag (a policy that fills the disk earned nothing; it is no provider failure).
4. ``final_check`` measures once more when the agent phase ends (``stop_processes``), so a write
   just before the end, between two passes, is judged too.

A container is re-walked no sooner than ``COST_RATIO`` times its last walk's duration, so a
large layer costs the watchdog at most about 1/``COST_RATIO`` of a core. What this cannot do: a
burst between two passes (``fallocate`` is instant) lands on the host's disk before the kill,
and its blocks are freed only when the container is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

INTERVAL = 1.0
"""Seconds between two passes."""
ENTRY_COST = 256
"""Bytes charged per entry of the layer: the inode an empty file or a symlink still takes."""
MAX_ENTRIES = 500_000
"""Entries one walk of one container may visit; past it the container is judged over."""
COST_RATIO = 10.0
"""A container is walked again no sooner than this many times its last walk took."""
MESSAGE = "killed: the container's disk limit ({limit_mb} MB) was exceeded ({reason})"


@dataclass(frozen=True, slots=True)
class Usage:
    """One walk of a layer: bytes charged, entries seen, whether the walk saw all of it, and
    what stopped it when a path could not be read (``problem``)."""

    bytes: int
    entries: int
    complete: bool
    seconds: float
    problem: str = ""


_VANISHED = (FileNotFoundError, NotADirectoryError)
"""What a path removed or replaced during the walk raises: nothing left to charge there."""


def measure(
    roots: Sequence[str], *, max_entries: int = MAX_ENTRIES, stop_above: int | None = None
) -> Usage:
    """What the trees under ``roots`` hold on the disk (see the module's step 1). The walk stops
    at ``max_entries`` entries, or once the sum is past ``stop_above``, or at a path it cannot
    read (a directory nested past ``PATH_MAX`` answers ``ENAMETOOLONG``: skipping it would
    leave whatever is under it uncharged): then ``complete`` is False. Entries that vanish
    during the walk are skipped, and so are roots after the first that are gone; a first root
    that is gone raises ``FileNotFoundError``."""
    started = time.monotonic()
    total = 0
    stack: list[str] = []
    for index, root in enumerate(roots):
        try:
            total += os.lstat(root).st_blocks * 512
        except FileNotFoundError:
            if index == 0:
                raise
            continue
        stack.append(root)
    entries = 0
    linked: set[int] = set()

    def stopped(problem: str = "") -> Usage:
        return Usage(total, entries, False, time.monotonic() - started, problem)

    while stack:
        try:
            with os.scandir(stack.pop()) as scan:
                for entry in scan:
                    entries += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except _VANISHED:
                        continue
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        if info.st_ino in linked:
                            continue
                        linked.add(info.st_ino)
                    total += info.st_blocks * 512 + ENTRY_COST
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
                    if entries >= max_entries or (stop_above is not None and total > stop_above):
                        return stopped()
        except _VANISHED:
            continue
        except OSError as exc:
            return stopped(exc.strerror or type(exc).__name__)
    return Usage(total, entries, True, time.monotonic() - started)


@dataclass(slots=True)
class Watched:
    """One watched container: where what it writes lands on the host (its layer first), its
    limit, and what the watchdog found."""

    key: str
    paths: tuple[str, ...]
    limit_mb: int
    kill: Callable[[], Awaitable[None]]
    used: int = 0
    exceeded: bool = False
    reason: str = ""
    due: float = 0.0
    walks: int = 0
    kill_failed: bool = False
    """Its kill failed: the next pass tries again (only then: a pass running beside the one
    that judged it must not kill it a second time)."""

    @property
    def limit(self) -> int:
        return self.limit_mb * 1024 * 1024

    @property
    def message(self) -> str:
        return MESSAGE.format(limit_mb=self.limit_mb, reason=self.reason)

    def judge(self, usage: Usage) -> bool:
        """Record ``usage``; True when it puts the container over its limit."""
        self.used = usage.bytes
        self.walks += 1
        if usage.bytes > self.limit:
            self.reason = f"{usage.bytes / 1048576:.0f} MB or more written"
        elif usage.problem:
            self.reason = f"a path in it cannot be measured: {usage.problem}"
        elif not usage.complete:
            self.reason = f"more than {usage.entries} files, too many to measure"
        else:
            return False
        self.exceeded = True
        return True


@dataclass(slots=True)
class WatchStats:
    """What the watchdog has cost so far (``bench/disk_watch.py`` prints it)."""

    passes: int = 0
    walks: int = 0
    walk_seconds: float = 0.0
    entries: int = 0
    kills: int = 0
    pass_seconds: float = 0.0


class DiskWatch:
    """The watchdog of one runtime (see the module's docstring)."""

    def __init__(
        self,
        *,
        interval: float = INTERVAL,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.max_entries = max_entries
        self.clock = clock
        self.stats = WatchStats()
        self._watched: dict[str, Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set when nothing is left to watch: the task ends now

    @property
    def watching(self) -> int:
        return len(self._watched)

    @property
    def running(self) -> bool:
        """Whether the watchdog's task is alive."""
        return self._task is not None and not self._task.done()

    def watch(
        self, key: str, paths: Sequence[str], limit_mb: int, kill: Callable[[], Awaitable[None]]
    ) -> Watched:
        """Watch what is under ``paths`` (a container's upper dir first, then any other host
        directory it can write into); ``kill`` ends every process of the container. Starts the
        watchdog's task if it is not running (in this loop)."""
        watched = Watched(key, tuple(paths), limit_mb, kill)
        self._watched[key] = watched
        loop = asyncio.get_running_loop()
        if not self.running or (self._task is not None and self._task.get_loop() is not loop):
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="rollgym-disk-watch")
        return watched

    def unwatch(self, key: str) -> Watched | None:
        """Stop watching ``key`` (the task ends when nothing is left)."""
        watched = self._watched.pop(key, None)
        if not self._watched:
            self._wake.set()
        return watched

    async def final_check(self, key: str) -> Watched | None:
        """Measure ``key`` once more now, then stop watching it (its processes are gone: nothing
        writes any more). Marks it over its limit if it is; kills nothing."""
        watched = self.unwatch(key)
        if watched is None or watched.exceeded:
            return watched
        with contextlib.suppress(FileNotFoundError):
            watched.judge(await asyncio.to_thread(self._measure, watched))
        return watched

    async def check_once(self) -> list[Watched]:
        """One pass: walk every due container; mark and kill the ones over their limit (these
        are returned). One whose kill failed stays watched, and its kill is tried again at
        every pass until it holds or the container is unwatched."""
        now = self.clock()
        pending = [w for w in self._watched.values() if w.kill_failed]
        for watched in pending:  # taken, as below
            watched.kill_failed = False
        due = [w for w in self._watched.values() if w.due <= now and not w.exceeded]
        self.stats.passes += 1
        for watched in due:  # taken: a pass running beside this one leaves them alone
            watched.due = math.inf
        try:
            over, gone = await asyncio.to_thread(self._walk, due) if due else ([], [])
        finally:
            for watched in due:  # a walk that never came back is due again
                if watched.due == math.inf:
                    watched.due = now
        for watched in gone:
            self.unwatch(watched.key)
        killing = over + pending
        killed = await asyncio.gather(*(self._kill(w) for w in killing))
        for watched, done in zip(killing, killed, strict=True):
            if done:
                self.unwatch(watched.key)
            else:
                watched.kill_failed = True
        return over

    def _measure(self, watched: Watched) -> Usage:
        return measure(watched.paths, max_entries=self.max_entries, stop_above=watched.limit)

    def _walk(self, due: list[Watched]) -> tuple[list[Watched], list[Watched]]:
        """In a worker thread: measure each of ``due``; return the ones over their limit and
        the ones whose layer is gone (the container was removed, by a reaper say)."""
        over: list[Watched] = []
        gone: list[Watched] = []
        for watched in due:
            try:
                usage = self._measure(watched)
            except FileNotFoundError:
                gone.append(watched)
                continue
            except OSError as exc:  # a root it cannot read: no layer that can be vouched for
                usage = Usage(0, 0, False, 0.0, exc.strerror or type(exc).__name__)
            self.stats.walks += 1
            self.stats.walk_seconds += usage.seconds
            self.stats.entries += usage.entries
            watched.due = self.clock() + max(self.interval, usage.seconds * COST_RATIO)
            if watched.judge(usage):
                over.append(watched)
        return over, gone

    async def _kill(self, watched: Watched) -> bool:
        """Kill ``watched``'s processes; False when the kill failed (tried again next pass)."""
        self.stats.kills += 1
        log.warning("container %s: %s", watched.key[:12], watched.message)
        try:
            await watched.kill()
        except Exception as exc:
            log.warning("container %s: the disk watchdog's kill failed: %s", watched.key[:12], exc)
            return False
        return True

    async def _run(self) -> None:
        """Pass after pass while anything is watched."""
        try:
            while self._watched:
                started = self.clock()
                try:
                    await self.check_once()
                except Exception:  # one bad pass must not end the watch of every container
                    log.exception("a pass of the disk watchdog failed")
                self.stats.pass_seconds += self.clock() - started
                # Not cancelled when emptied: a kill under way must finish. Woken instead.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
                self._wake.clear()
        finally:
            if self._task is asyncio.current_task():
                self._task = None
