"""Dispatchers: who runs the rollout core. ``LocalDispatcher`` runs it in asyncio workers of
this process; ``rollgym.ray.dispatch.RayDispatcher`` in worker actors across a cluster. Both take
pending ``RolloutItem``s (an iterator, or a ``Feed`` that may make them wait: the streaming API's
rows arrive over time and stop under back-pressure), run each through ``RolloutRunner`` and hand
every record to the one ``Recorder``; neither writes anything itself. ``LocalDispatcher`` may be given another runner
(``runner=``): ``rollgym reverify`` runs ``/verify`` on recorded rollouts through the same path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollgym.collect.dialect import Dialects
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import RolloutItem, RolloutRecord
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target

RAMP_STEP = 256  # workers started per wave
RAMP_INTERVAL = 0.1  # seconds between waves


@dataclass
class DispatchReport:
    """What a dispatch did: rollouts held by an open circuit, sent to another replica; the
    call counters of HTTP clients other than the caller's (remote workers'); and sections of
    its own for ``metrics.json`` and ``run.json`` (e.g. ``ray``); ``abandoned``: after
    ``cancel``, the rollouts it had started and not recorded, where it counts them only once
    they stopped (None: ``in_flight`` at the cancel said it)."""

    circuit_holds: int = 0
    failovers: int = 0
    http: list[dict[str, dict[str, int]]] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    abandoned: int | None = None


@runtime_checkable
class Feed(Protocol):
    """Work that arrives over time (``rollgym.trainer.stream``): ``take`` waits for it."""

    async def take(self, n: int) -> list[RolloutItem]:
        """1 to ``n`` items, waiting for the first; an empty list once no more will come."""

    def requeue(self, items: list[RolloutItem]) -> None:
        """Items handed out that must run again (their worker died before recording them)."""


Work = Iterator[RolloutItem] | Feed
"""What a dispatch runs: a fixed iterator of items (a run, a batch) or a ``Feed``."""


class Dispatcher(Protocol):
    """Runs rollouts and hands their records to a recorder."""

    async def start(self, http: HttpClient, agents: dict[str, Target]) -> None:
        """Get ready to run rollouts against ``agents`` (a failure here: the run never
        started). ``http`` is the caller's client, for dispatchers that run in-process."""

    async def dispatch(self, work: Iterator[RolloutItem], pending: int, recorder: Recorder) -> None:
        """Run ``work`` (``pending`` items) until each has a record or the recorder aborts."""

    def cancel(self) -> None:
        """Abort: cancel every rollout in flight; they stay unrecorded."""

    @property
    def in_flight(self) -> int | None:
        """Rollouts started (sent to their agent) and not yet recorded (None: not known
        here): at a budget's ``abandon``, the ones cancelled (``abandoned``)."""

    async def close(self) -> None:
        """Release what ``start`` took."""

    async def report(self) -> DispatchReport:
        """What the dispatch did, for ``metrics.json`` and ``run.json``."""


class FeedDispatcher(Dispatcher, Protocol):
    """A dispatcher that also runs a ``Feed`` (``LocalDispatcher``, ``RayDispatcher``): the
    streaming API's."""

    async def dispatch(self, work: Work, pending: int, recorder: Recorder) -> None:
        """Run ``work`` (a ``Feed``: ``pending`` is the most to run at once) until each item
        has a record, the feed ends, or the recorder aborts."""


class Runner(Protocol):
    """Runs one rollout to its record (``RolloutRunner`` is the one of every run)."""

    on_hold: Callable[[RollgymError], None] | None
    circuit_holds: int
    failovers: int

    async def run(self, item: RolloutItem) -> RolloutRecord:
        """``item``'s record; never raises but ``CancelledError``."""


RunnerFactory = Callable[[HttpClient, dict[str, Target], RolloutPolicy, Callable[[], bool]], Runner]
"""Makes the runner of a dispatch: (client, agents, policy, stopping) -> runner."""


def _rollout_runner(dialects: Dialects) -> RunnerFactory:
    """The default: rollouts through their server's ``/run``, in ``dialects``."""

    def make(
        http: HttpClient,
        agents: dict[str, Target],
        policy: RolloutPolicy,
        stopping: Callable[[], bool],
    ) -> Runner:
        return RolloutRunner(http, agents, policy, stopping=stopping, dialects=dialects)

    return make


def cancel_others(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` but the one running this (an abort is decided inside a worker, which
    must finish recording before it stops)."""
    current = asyncio.current_task()
    for task in tasks:
        if task is not current:
            task.cancel()


class LocalDispatcher:
    """At most ``concurrency`` rollouts in flight, as asyncio tasks of this event loop, each
    run by the runner that ``runner`` makes (default: a ``RolloutRunner`` speaking
    ``dialects``, the flat row only when None)."""

    def __init__(
        self,
        policy: RolloutPolicy,
        concurrency: int,
        *,
        runner: RunnerFactory | None = None,
        dialects: Dialects | None = None,
    ) -> None:
        self.policy = policy
        self.concurrency = concurrency
        self.make_runner = runner or _rollout_runner(dialects or Dialects())
        self.runner: Runner | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._cancelled = False

    async def start(self, http: HttpClient, agents: dict[str, Target]) -> None:
        self.runner = self.make_runner(http, agents, self.policy, lambda: self._cancelled)

    async def dispatch(self, work: Work, pending: int, recorder: Recorder) -> None:
        assert self.runner is not None, "start() first"
        self.runner.on_hold = recorder.held
        n = min(self.concurrency, max(1, pending))
        # Ramp up in waves: thousands of simultaneous connects overflow the accept backlog,
        # time out, and would open the agent's circuit breaker before any work is done.
        # Each wave is started when it is due (not all at once, each sleeping its delay): a
        # sleeping worker holds a timer and a frame until its turn.
        self._workers = []
        try:
            while len(self._workers) < n and not (self._cancelled or recorder.aborted):
                if self._workers:
                    await asyncio.sleep(RAMP_INTERVAL)
                wave = min(RAMP_STEP, n - len(self._workers))
                self._workers += [
                    asyncio.create_task(self._worker(work, recorder)) for _ in range(wave)
                ]
        except BaseException:
            # Cancelled mid-ramp: the workers started so far end with it, as under ``gather``.
            cancel_others(self._workers)
            await asyncio.gather(*self._workers, return_exceptions=True)
            raise
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def _worker(self, work: Work, recorder: Recorder) -> None:
        assert self.runner is not None, "start() first"
        try:
            if isinstance(work, Feed):
                while items := await work.take(1):
                    for item in items:
                        if not await self._run(item, recorder):
                            return
                return
            for item in work:
                if not await self._run(item, recorder):
                    return
        except Exception as exc:
            recorder.crashed("collector worker", exc)

    async def _run(self, item: RolloutItem, recorder: Recorder) -> bool:
        """Run ``item`` and record it; False once the run is aborted (nothing is run)."""
        assert self.runner is not None, "start() first"
        await recorder.resumed.wait()
        if recorder.aborted:
            return False
        recorder.record(await self.runner.run(item))
        return True

    def cancel(self) -> None:
        self._cancelled = True
        cancel_others(self._workers)

    @property
    def in_flight(self) -> int | None:
        runner = self.runner
        count = getattr(runner, "in_flight", None)  # a RolloutRunner counts; a test's may not
        return count if isinstance(count, int) else None

    async def close(self) -> None:
        """Nothing to release: the HTTP client is the caller's."""

    async def report(self) -> DispatchReport:
        runner = self.runner
        if runner is None:
            return DispatchReport()
        # No HTTP counters of its own: it calls through the caller's client.
        return DispatchReport(circuit_holds=runner.circuit_holds, failovers=runner.failovers)
