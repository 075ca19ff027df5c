"""The watchdog: a server process that dies mid-run is started again, a crash loop stops the run.

While a run collects, the launcher's group is polled every half second. A replica whose
process ended is restarted on the same address (after a short backoff, so callers' breakers see
one outage, not a flapping server); its callers' circuit breakers recover by themselves once
it answers again, and the rollouts that were in flight on it were already recorded as failures
by the calls that lost their connection. A replica that has been restarted ``max_restarts``
times within ``window`` seconds is in a crash loop: the run is aborted with the server's name,
its exit code and the last lines of its log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from rollgym.launch.group import ProcessGroup

log = logging.getLogger("rollgym.launch")

WATCH_INTERVAL = 0.1
"""Seconds between polls of the processes: each is one ``waitpid``; a dead server found late
fails every rollout sent to it meanwhile."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How often a dead server is started again before its crashes end the run."""

    max_restarts: int = 3
    window: float = 60.0
    backoff: tuple[float, ...] = (0.5, 1.0, 2.0)

    def delay(self, recent: int) -> float:
        return self.backoff[min(recent, len(self.backoff) - 1)]


class Watchdog:
    """Restarts the dead replicas of ``group``; ``restarts`` counts them per replica."""

    def __init__(
        self,
        group: ProcessGroup,
        startup_timeout: float,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.startup_timeout = startup_timeout
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.restarts: Counter[str] = Counter()
        self._recent: dict[str, deque[float]] = {}

    async def run(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        """Watch until cancelled, or until a crash loop (then ``on_fatal(reason)``).
        ``pause(True)`` while a server is being restarted, ``pause(False)`` once it answers:
        new rollouts sent meanwhile would only fail."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            dead = self.group.poll()
            if not dead:
                continue
            if pause is not None:
                pause(True)
            try:
                for key, code in dead.items():
                    reason = await self._revive(key, code)
                    if reason is not None:
                        on_fatal(reason)
                        return
            finally:
                if pause is not None:
                    pause(False)

    async def _revive(self, key: str, code: int) -> str | None:
        """Restart replica ``key`` (``name.replica``), which exited with ``code``; the reason to
        stop the run if it cannot be (a crash loop, or it does not come back)."""
        name, _, index = key.rpartition(".")
        server = self.group.find(name, int(index))
        now = self.clock()
        recent = self._recent.setdefault(key, deque())
        while recent and now - recent[0] > self.policy.window:
            recent.popleft()
        if len(recent) >= self.policy.max_restarts:
            return (
                f"server {name} keeps crashing: exited with code {code} after "
                f"{len(recent)} restarts in {self.policy.window:g}s ({server.describe()})"
                f"{server.log_tail()}"
            )
        log.warning("server %s exited with code %s (%s); restarting it", name, code,
                    server.describe())  # fmt: skip
        await asyncio.sleep(self.policy.delay(len(recent)))
        recent.append(self.clock())
        self.restarts[key] += 1
        try:
            await self.group.restart(name, int(index), self.startup_timeout)
        except Exception as err:  # an OSError from spawn (no fds, no fork) too: never silent
            return f"server {name} exited with code {code} and could not be restarted: {err}"
        return None

    def report(self) -> dict[str, int]:
        """Restarts per replica (``name.replica``), for ``metrics.json``."""
        return dict(self.restarts)
