"""A hung, frozen or stalled upstream caught while the proxy waits for a whole answer.

The proxy asks its upstream for whole answers (``rollgym.models.proxy`` says why). A whole answer
sends no byte until its generation ends, so silence alone cannot tell a long generation from a
replica that hung. ``LivenessTransport`` wraps the client's transport and watches the attempts
made inside ``watching`` (whole-answer chat calls), per replica, with one **heartbeat** for
every call in flight there:

1. while a replica has watched attempts in flight, its heartbeat (one task per replica; it
   stops when nothing is in flight) asks it every ``Watch.every`` seconds (5 by default)
   whether it is alive: a ``POST`` to its health URL with a timeout of its own
   (``Watch.probe_timeout``, 5 s). Any HTTP answer below 500 means its server is up (200 from
   vLLM's ``/ping``, which takes POST and runs the check of its ``/health``; 404 from a server
   without the path, such as OpenAI, SGLang or a rollgym server);
2. no connection, no answer within the probe's timeout, or a 5xx (vLLM's ``/ping`` answers 503
   for a dead engine), while the replica shows no progress either (its ``/metrics`` not read in
   the same beat, or its token counters not moved since the previous beat's), fails **every**
   watched attempt sent to that replica before the probe, at once, as ``ReplicaDown``, closes
   their connections (vLLM aborts a request whose client went away), and tells ``on_down``,
   which opens the replica's circuit breakers (the proxy's). The client does not retry a
   ``ReplicaDown`` on that replica; the proxy's ``Replicas`` fails the call over to another,
   and with one replica the call fails at once. A failed probe while
   the counters move (a slow ``/ping`` behind a busy engine) is logged and counted
   (``probe_misses``), not fatal; with no earlier reading to compare, a second failed probe
   decides;
3. in the same beat, a replica whose engine exports token counters (``Watch.metrics_url``:
   vLLM's and SGLang's ``/metrics``) and whose counters stood still for ``stall_timeout`` with
   requests in its engine, or since a call sent there that its engine never started, fails its
   watched attempts the same way, as ``ReplicaStalled`` (``rollgym.models.progress``): its
   server answers, its engine makes no progress;
4. a call that has run far longer than the replica's recent answers of its size is sent again
   (a hedge, ``rollgym.models.hedge``): the first answer wins, the other request is
   cancelled; a bounded share of calls, counted in ``hedges`` and, per call, in the
   ``Watched`` record that ``watching`` yields;
5. the attempt's own timeout bounds the wait, as for any call.

So a frozen replica (a SIGSTOPped vLLM: the kernel still accepts connections, nothing answers;
its ``/metrics`` neither) fails all of its calls within ``every + probe_timeout`` seconds of
the freeze (10 s with the defaults), whatever their number, and takes no new ones until its
breaker's probe finds it back. A probe's timeout is a judgement of the whole replica, so it
is generous: a vLLM whose API server shares a few busy cores with its engine may take a good
fraction of a second to answer (seen on 2 CPU cores: more than 0.2 s), 25 times less than the
default.

A failed probe fails every attempt waiting on its replica, so it must mean the replica did not
answer: probes go through a transport of their own (``probe_transport``), not the pool of the
calls they watch. In that pool a probe would wait for a connection behind those calls, and a
full pool of healthy long generations would fail all of them at once. The probes' pool has no
limit (one probe in flight per replica), so no time of a probe is spent waiting for a local
connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rollgym.errors import ReplicaDown, ReplicaStalled, RollgymError
from rollgym.http.default import default_transport
from rollgym.http.transport import RawAnswer, Request, Transport
from rollgym.models.hedge import HedgeBudget, Latencies, Size
from rollgym.models.progress import STALL_TIMEOUT_S, Progress, Reading, read_metrics

log = logging.getLogger("rollgym.models.liveness")

HEARTBEAT_S = 5.0
"""Seconds between a replica's liveness probes while calls are in flight there (the proxy's
``heartbeat``)."""

PROBE_TIMEOUT_S = 5.0
"""Seconds a probe may take by default (the proxy's ``probe_timeout``): a live server answers a
health check at once, but a vLLM whose API server shares a few busy cores with its engine may
take a good fraction of a second (seen on 2 CPU cores: more than 0.2 s)."""

PROBE_KEEPALIVE_S = 2.0
"""Seconds a probe's connection is kept for the next probe: below the keep-alive of vLLM's
server (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s), so a probe is never sent on a connection the
replica is closing (a reset there would read as a dead replica)."""

MetricsGet = Callable[[str, Mapping[str, str] | None, float], Awaitable[tuple[int, str]]]
"""``GET url`` with headers and a timeout: (status, text)."""


@dataclass(frozen=True, slots=True)
class Watch:
    """How to watch one replica: its health URL (and path, for messages), probed every
    ``every`` seconds while calls are in flight there, each probe given ``probe_timeout``
    seconds; its ``metrics_url`` (``None``: progress not watched), stalled after
    ``stall_timeout`` seconds without progress; ``replica``: its index, for ``on_down``."""

    url: str
    path: str
    every: float = HEARTBEAT_S
    probe_timeout: float = PROBE_TIMEOUT_S
    metrics_url: str | None = None
    stall_timeout: float | None = STALL_TIMEOUT_S
    replica: int = 0


@dataclass(slots=True)
class Watched:
    """One watched call: its replica's watch, its size (for the hedge's latencies), and how
    many hedged requests it sent."""

    watch: Watch
    size: Size | None = None
    hedged: int = 0


@dataclass(frozen=True, slots=True)
class _Down:
    """Why a replica's watched attempts were failed: ``stalled`` seconds without progress
    (else the probe failed), ``problem`` in words."""

    problem: str
    stalled: float | None = None


@dataclass(eq=False, slots=True)
class _Beat:
    """One replica's heartbeat: its watched attempts in flight (their alarms, and when each
    was sent), the task that probes it, and its progress."""

    watch: Watch
    progress: Progress | None
    waiting: dict[asyncio.Future[_Down], float] = field(default_factory=dict)
    headers: Mapping[str, str] | None = None
    server: str = ""
    task: asyncio.Task[None] | None = None
    metrics: bool = True  # False once the replica showed it has no token counters
    missed: int = 0  # failed probes in a row, forgiven because its counters moved


_WATCH: ContextVar[Watched | None] = ContextVar("rollgym_liveness_watch", default=None)


@contextmanager
def watching(watch: Watch, size: Size | None = None) -> Iterator[Watched]:
    """Watch the attempts sent inside this block (in this task) with ``watch``; ``size`` is the
    call's bucket (``rollgym.models.hedge.size_bucket``). Yields the call's ``Watched``."""
    watched = Watched(watch, size)
    token = _WATCH.set(watched)
    try:
        yield watched
    finally:
        _WATCH.reset(token)


async def _aiohttp_get(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str] | None, limit: float
) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=limit)
    async with session.get(url, headers=headers, timeout=timeout) as answer:
        return answer.status, await answer.text() if answer.status == 200 else ""


class LivenessTransport:
    """The proxy's transport: ``inner``, with the attempts made inside ``watching`` watched (see
    the module docstring); every other attempt is ``inner``'s, unchanged. Probes go through
    ``probe_transport``: by default a ``default_transport()`` of their own without a pool
    limit, never ``inner``'s pool; ``/metrics`` is read with ``metrics_get`` (by default an
    aiohttp session of its own: a GET). ``on_down(watch, reason, error)`` hears of a replica
    found down or stalled (``error``: a ``ReplicaDown`` or ``ReplicaStalled`` saying so, what
    opened its breakers), before its attempts see their errors. ``hedging`` off sends no hedges."""

    def __init__(
        self,
        inner: Transport,
        *,
        probe_transport: Transport | None = None,
        metrics_get: MetricsGet | None = None,
        on_down: Callable[[Watch, str, ReplicaDown], None] | None = None,
        hedging: bool = True,
        latencies: Latencies | None = None,
        budget: HedgeBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.probe_transport: Transport = (
            default_transport(limit=0, keepalive_timeout=PROBE_KEEPALIVE_S)
            if probe_transport is None
            else probe_transport
        )
        self._session: aiohttp.ClientSession | None = None
        self._metrics_get = metrics_get
        self.on_down = on_down
        self.hedging = hedging
        self.latencies = latencies or Latencies()
        self.budget = budget or HedgeBudget(clock=clock)
        self._clock = clock
        self._beats: dict[str, _Beat] = {}
        self.probes = 0
        """Probes sent, for tests and stats."""
        self.scrapes = 0
        """``/metrics`` reads, for tests and stats."""
        self.hedges = 0
        """Hedged requests sent."""
        self.downs = 0
        """Times a replica was found down or stalled."""
        self.probe_misses = 0
        """Failed probes not held against a replica because its token counters moved."""

    async def close(self) -> None:
        for beat in self._beats.values():
            if beat.task is not None:
                beat.task.cancel()
        for transport in {id(t): t for t in (self.inner, self.probe_transport)}.values():
            close = getattr(transport, "close", None)
            if close is not None:
                await close()
        if self._session is not None:
            await self._session.close()

    # -- one watched attempt -------------------------------------------------------------------

    async def send(self, request: Request) -> RawAnswer:
        watched = _WATCH.get()
        if watched is None:
            return await self.inner.send(request)
        watch = watched.watch
        # A whole answer: silence is expected, so no idle cut; the heartbeat instead.
        request = request._replace(idle_timeout=None)
        start = self._clock()
        alarm: asyncio.Future[_Down] = asyncio.get_running_loop().create_future()
        beat = self._enter(watch, request, alarm, start)
        first = asyncio.ensure_future(self.inner.send(request))
        racing = {first: start}
        hedged_before = watched.hedged  # this attempt's hedges are handed back when it ends
        # When to look at hedging this call next (seconds after its start): when the
        # replica's recent answers say, or, while they are too few to say (or the budget is
        # spent), again after the hedge's floor.
        looking, look_at = self.hedging, 0.0
        if looking:
            self.budget.note_call()
            due = self.latencies.hedge_after(watch.url, watched.size)
            look_at = self.latencies.min_seconds if due is None else due
        try:
            while True:
                timeout = max(0.0, start + look_at - self._clock()) if looking else None
                waits: list[asyncio.Future[Any]] = [*racing, alarm]
                done, _ = await asyncio.wait(
                    waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if alarm.done():
                    raise self._failed(alarm.result(), request, start)
                if not done:
                    looking, look_at = self._hedge(request, watched, racing, start)
                    continue
                for task in [t for t in racing if t.done()]:
                    sent_at = racing.pop(task)
                    if task.cancelled() or task.exception() is not None:
                        continue
                    answer = task.result()
                    if answer.status < 500:
                        if answer.status < 400:
                            self.latencies.add(watch.url, watched.size, self._clock() - sent_at)
                        return answer
                if not racing:  # every request failed: the original's failure
                    return first.result()
        finally:
            self._leave(beat, alarm)
            for _ in range(watched.hedged - hedged_before):
                self.budget.finished(watch.url)
            for task in racing:
                task.cancel()  # closes its connection: the upstream may drop the request
            if racing:
                await asyncio.wait(racing)
            for task in (first, *racing):
                if task.done() and not task.cancelled():
                    task.exception()  # seen: an answer that lost the race is not an error

    def _hedge(
        self,
        request: Request,
        watched: Watched,
        racing: dict[asyncio.Task[RawAnswer], float],
        start: float,
    ) -> tuple[bool, float]:
        """Send a hedge of ``request`` if the call has run far longer than its replica's
        recent answers of its size and the budget allows; return whether to look again, and
        when (seconds after ``start``)."""
        elapsed = self._clock() - start
        due = self.latencies.hedge_after(watched.watch.url, watched.size)
        if due is not None and elapsed < due:
            return True, due
        left = request.timeout - elapsed
        if due is None or not self.budget.try_hedge(watched.watch.url):
            return left > 0, elapsed + self.latencies.min_seconds
        if left <= 0:
            return False, 0.0
        hedge = asyncio.ensure_future(self.inner.send(request._replace(timeout=left)))
        racing[hedge] = self._clock()
        watched.hedged += 1
        self.hedges += 1
        log.info("%s: no answer after %.1fs; sent a hedged request", request.server, elapsed)
        return False, 0.0

    def _failed(self, down: _Down, request: Request, start: float) -> ReplicaDown:
        waited = self._clock() - start
        if down.stalled is not None:
            klass: type[ReplicaDown] = ReplicaStalled
            message = (
                f"{request.server} made no progress for {down.stalled:.0f}s ({down.problem}); "
                f"this call waited {waited:.1f}s, and the replica's circuit is open"
            )
        else:
            klass = ReplicaDown
            message = (
                f"{request.server} gave no answer in {waited:.1f}s and failed its liveness "
                f"probe ({down.problem}); the replica's circuit is open"
            )
        return klass(
            message, server=request.server, endpoint=request.endpoint, method="POST",
            url=request.url, retryable=False,
        )  # fmt: skip

    @staticmethod
    def _found_down(beat: _Beat, down: _Down) -> ReplicaDown:
        """The replica's state as an error: what opens its breakers (``CircuitBreaker.cause``)."""
        watch, server = beat.watch, beat.server or beat.watch.url
        if down.stalled is not None:
            return ReplicaStalled(
                f"{server} made no progress for {down.stalled:.0f}s ({down.problem})",
                server=beat.server, endpoint=watch.path, method="POST", url=watch.url,
                retryable=False,
            )  # fmt: skip
        return ReplicaDown(
            f"{server} failed its liveness probe ({down.problem})", server=beat.server,
            endpoint=watch.path, method="POST", url=watch.url, retryable=False,
        )  # fmt: skip

    # -- the heartbeat of one replica ----------------------------------------------------------

    def _enter(
        self, watch: Watch, request: Request, alarm: asyncio.Future[_Down], start: float
    ) -> _Beat:
        beat = self._beats.get(watch.url)
        if beat is None or beat.watch != watch:
            stall = watch.stall_timeout
            progress = None if watch.metrics_url is None or stall is None else Progress(stall)
            beat = self._beats[watch.url] = _Beat(watch, progress)
        beat.waiting[alarm] = start
        beat.headers, beat.server = request.headers, request.server
        if beat.task is None or beat.task.done():
            if beat.progress is not None:
                beat.progress.restart(start)
            beat.missed = 0
            beat.task = asyncio.ensure_future(self._beat(beat))
        return beat

    @staticmethod
    def _leave(beat: _Beat, alarm: asyncio.Future[_Down]) -> None:
        beat.waiting.pop(alarm, None)
        if not beat.waiting and beat.task is not None:
            beat.task.cancel()  # nothing in flight: the replica is not asked until there is
            beat.task = None

    async def _beat(self, beat: _Beat) -> None:
        watch = beat.watch
        while beat.waiting:
            await asyncio.sleep(watch.every)
            began = self._clock()
            problem, reading = await asyncio.gather(self._ask(beat), self._read(beat))
            down = None
            if problem is not None:
                down = self._judge_probe(beat, problem, reading)
            else:
                beat.missed = 0
            if down is None and reading is not None and beat.progress is not None:
                down = self._judge_progress(beat, reading, answered=problem is None)
            if down is not None:
                self._down(beat, down, began)

    def _judge_probe(self, beat: _Beat, problem: str, reading: Reading | None) -> _Down | None:
        """A failed probe: the replica is down unless its counters show progress. (A probe
        is one slow request; counters that moved since the last beat are the engine's word.)"""
        path = beat.watch.path
        moved = None if beat.progress is None else beat.progress.moved(reading)
        # No earlier reading to compare with: the next beat's decides (a second failed probe).
        if moved or (moved is None and reading is not None and beat.missed == 0):
            beat.missed += 1
            self.probe_misses += 1
            log.warning(
                "%s: POST %s failed (%s), but its token counters %s; not held against it",
                beat.server or beat.watch.url, path, problem,
                "moved" if moved else "were read (the next beat compares them)",
            )  # fmt: skip
            return None
        return _Down(f"POST {path}: {problem}")

    def _judge_progress(self, beat: _Beat, reading: Reading, *, answered: bool) -> _Down | None:
        """Whether the replica's counters stood still too long (``rollgym.models.progress``)."""
        progress = beat.progress
        assert progress is not None
        stalled = progress.stalled(reading, self._clock(), beat.waiting.values())
        if stalled is None:
            return None
        busy = "" if reading.busy is None else f", {reading.busy:g} in its engine"
        if reading.busy == 0:
            busy = ", none in its engine by its last report"
        held = {label: b for label, _, b in reading.engines}
        if progress.engine is not None:
            busy = f" of engine {progress.engine}, holding {held.get(progress.engine) or 0:g}"
        probe = f"POST {beat.watch.path} answers" if answered else "its probe failed too"
        progress.restart(self._clock())
        return _Down(
            f"its token counters at GET /metrics stood still with calls in flight{busy}; {probe}",
            stalled,
        )

    def _down(self, beat: _Beat, down: _Down, before: float) -> None:
        """Fail every attempt sent to ``beat``'s replica before ``before``, and tell
        ``on_down`` first (its breakers open before the attempts' retries are decided)."""
        self.downs += 1
        log.warning("%s is down: %s", beat.server or beat.watch.url, down.problem)
        if self.on_down is not None:
            self.on_down(beat.watch, down.problem, self._found_down(beat, down))
        for alarm, sent in list(beat.waiting.items()):
            if sent <= before and not alarm.done():
                alarm.set_result(down)

    async def _ask(self, beat: _Beat) -> str | None:
        """What is wrong with ``beat``'s replica (``None``: it answered its probe)."""
        self.probes += 1
        watch, limit = beat.watch, beat.watch.probe_timeout
        try:
            # The transport's own timeouts, and one around it: a probe never outlives its limit.
            async with asyncio.timeout(limit):
                answer = await self.probe_transport.send(
                    Request(watch.url, b"{}", beat.headers, limit, limit, beat.server, watch.path)
                )
        except TimeoutError:
            return f"no answer within {limit:g}s"
        except RollgymError as err:
            if err.type == "read_timeout":
                return f"no answer within {limit:g}s"
            return err.message  # redacted when the error was made
        if answer.status >= 500:
            return f"answered {answer.status}"
        return None

    async def _read(self, beat: _Beat) -> Reading | None:
        """The replica's token counters, or ``None`` (not watched, not exported, or not read
        this time: a replica that does not answer is the probe's to judge)."""
        url = beat.watch.metrics_url
        if url is None or beat.progress is None or not beat.metrics:
            return None
        self.scrapes += 1
        limit = beat.watch.probe_timeout
        try:
            async with asyncio.timeout(limit):
                status, text = await self._get(url, beat.headers, limit)
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None
        if status in (404, 405):
            beat.metrics = False  # e.g. OpenAI: no counters, no progress watch
            return None
        reading = read_metrics(text) if status == 200 else None
        if status == 200 and reading is None:
            beat.metrics = False  # a /metrics without engine token counters
        return reading

    async def _get(
        self, url: str, headers: Mapping[str, str] | None, limit: float
    ) -> tuple[int, str]:
        if self._metrics_get is not None:
            return await self._metrics_get(url, headers, limit)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return await _aiohttp_get(self._session, url, headers, limit)
