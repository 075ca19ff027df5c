"""What a run shows while it runs: counts by outcome, failures by type and by root cause, the
rollouts' seconds, the recent per-hop timing, and the circuits of every server of the run.

``RunWatch`` listens to the recorder (one call per record: a few counters; the per-hop timing
of the agents' ``rollgym_timing`` only when a person is watching the progress bar) and feeds
both the collector's ``/metrics`` (``rollgym.collect.metrics_port``) and the progress bar's status
line (``status_line``). The circuits of the servers behind the agent (the agent's breakers for
its model and resources) live in those servers: with the progress bar on, ``poll`` asks each
one's ``/stats`` every ``POLL_SECONDS`` through a client of its own, so the run's ``http``
counters in ``metrics.json`` do not count the polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from rollgym.collect.metrics import CauseCounts
from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout
from rollgym.config import RetryPolicy
from rollgym.errors import CONTEXT_TYPES, RollgymError, is_known_type, root_cause
from rollgym.http import HttpClient, Target
from rollgym.http.breaker import CLOSED
from rollgym.prometheus.latency import MAX_NAMES, OTHER, Latency
from rollgym.prometheus.reward import Rewards
from rollgym.server.agent import TIMING_FIELD

if TYPE_CHECKING:
    from rollgym.collect.progress import RunProgress

log = logging.getLogger("rollgym.collect")

POLL_SECONDS = 2.0
"""Seconds between two polls of the servers' ``/stats`` (live progress only)."""
POLL_TIMEOUT = 2.0
STATUS_SECONDS = 1.0
"""Seconds between two updates of the status line."""
HOP_WINDOW = 30.0
"""Seconds per generation of the per-hop timing: the status line shows the last one or two
(30 to 60 s), so a hop that became slow shows within a minute."""
TIMING_KEYS = frozenset({"retries", "wait_s", "total_s", "end"})
"""The fields of ``rollgym_timing`` that are no hop."""


class RunWatch:
    """Counts of one collector's records, and what the live status line shows."""

    def __init__(self, *, hops: bool = False, clock: Any = time.monotonic) -> None:
        self.succeeded = 0
        self.failed = 0
        self.masked = 0
        self.failures: Counter[tuple[str, str]] = Counter()
        """(type, server) of each failed rollout's root error -> count; at most ``MAX_NAMES``
        pairs (the rest count as ``other``)."""
        self.causes: Counter[tuple[str, str]] = Counter()
        """(root cause, context) of each failed rollout (``rollgym.errors.root_cause``) ->
        count: types of the error tree (another is ``other``), context ``none`` when nothing
        ended it, so the pairs are bounded by the tree."""
        self.seconds = Latency()
        self.rewards = Rewards()
        """Rewards of the scored (unmasked) rollouts, by environment (``environment_of``)."""
        self.environment_of: Callable[[int], str] = lambda task_index: "run"
        """A task's environment (a server name of the config), set by the collector."""
        """Seconds of each recorded rollout, held and re-run attempts included."""
        self.watch_hops = hops
        self._clock = clock
        self._hops_now: dict[str, list[float]] = {}  # hop -> [seconds, calls]
        self._hops_before: dict[str, list[float]] = {}
        self._hops_since = clock()
        self.breakers: dict[str, str] = {}
        """``caller->server[replica]`` -> state, from the last poll of the servers' ``/stats``."""
        self._tasks: list[asyncio.Task[None]] = []

    def __call__(self, record: RolloutRecord) -> None:
        """The recorder's listener: one record."""
        self.seconds.observe(record.duration_s)
        if isinstance(record, FailedRollout):
            self.failed += 1
            self._failure(record.error)
            return
        if record.masked:
            self.masked += 1
        else:
            self.succeeded += 1
            self.rewards.observe(self.environment_of(record.task_index), record.reward)
        if self.watch_hops:
            self._hops(record)

    def _failure(self, error: RollgymError) -> None:
        root = error.root()
        key = (root.type, root.server or "?")
        if key not in self.failures and len(self.failures) >= MAX_NAMES - 1:
            key = (OTHER, OTHER)  # error types and server names come from other processes
        self.failures[key] += 1
        cause = root_cause(error)
        kind = cause.type if is_known_type(cause.type) else OTHER
        context = cause.context if cause.context in CONTEXT_TYPES else "none"
        self.causes[(kind, context)] += 1

    def _hops(self, record: ScoredRollout) -> None:
        timing = record.verified.get(TIMING_FIELD)
        if not isinstance(timing, dict):
            return
        now = self._clock()
        if now - self._hops_since >= HOP_WINDOW:
            self._hops_before, self._hops_now = self._hops_now, {}
            self._hops_since = now
        into = self._hops_now
        for hop, seconds in timing.items():
            # The agent's answer: take only what is shaped as Hops writes it.
            if hop in TIMING_KEYS or not isinstance(seconds, list):
                continue
            entry = into.get(hop)
            if entry is None:
                if len(into) >= MAX_NAMES:
                    continue
                entry = into[hop] = [0.0, 0.0]
            for took in seconds:
                if isinstance(took, (int, float)) and took >= 0:
                    entry[0] += took
                    entry[1] += 1

    def hop_means(self) -> dict[str, float]:
        """Mean seconds per call of each hop over the last 30 to 60 s, slowest first."""
        total: dict[str, list[float]] = {}
        for part in (self._hops_before, self._hops_now):
            for hop, (seconds, calls) in part.items():
                entry = total.setdefault(hop, [0.0, 0.0])
                entry[0] += seconds
                entry[1] += calls
        means = {hop: s / n for hop, (s, n) in total.items() if n}
        return dict(sorted(means.items(), key=lambda kv: -kv[1]))

    def failures_by_type(self) -> dict[str, int]:
        """Failed rollouts by their root error's type, most frequent first."""
        by_type: Counter[str] = Counter()
        for (kind, _), n in self.failures.items():
            by_type[kind] += n
        return dict(by_type.most_common())

    def failures_by_cause(self) -> CauseCounts:
        """Failed rollouts by root cause, with their context."""
        counts = CauseCounts()
        for (kind, context), n in self.causes.items():
            counts.add(kind, None if context == "none" else context, n)
        return counts

    def open_circuits(self, client: HttpClient | None = None) -> list[str]:
        """The circuits not closed: ``client``'s own (``collector->agent``) and those of the
        last poll (``agent->model[1]``), each with its state when half-open."""
        found = dict(self.breakers)
        if client is not None:
            for name in client.stats():
                breakers = client.breakers(name)
                for i, breaker in enumerate(breakers):
                    key = f"collector->{name}" + (f"[{i}]" if len(breakers) > 1 else "")
                    found[key] = breaker.state
        return [k if s == "open" else f"{k} ({s})" for k, s in found.items() if s != CLOSED]

    def status_line(self, client: HttpClient | None, in_flight: int | None) -> str:
        """The progress bar's second line (rich markup): in flight, failures by type, open
        circuits, the slowest hops."""
        parts = []
        if in_flight is not None:
            parts.append(f"in flight {in_flight}")
        if self.causes:
            shown = escape(self.failures_by_cause().describe(limit=3))
            parts.append(f"[red]failed: {shown}[/red]")
        circuits = self.open_circuits(client)
        if circuits:
            shown = ", ".join(map(escape, circuits[:4]))
            shown += f" +{len(circuits) - 4}" if len(circuits) > 4 else ""
            parts.append(f"[bold red]circuit open: {shown}[/bold red]")
        else:
            parts.append("circuits closed")
        hops = self.hop_means()
        if hops:
            shown = ", ".join(f"{escape(hop)} {_secs(s)}" for hop, s in list(hops.items())[:3])
            parts.append(f"slowest hops: {shown}")
        return "  ·  ".join(parts)

    # -- the live status line ------------------------------------------------------------

    def start_live(
        self,
        progress: RunProgress,
        client: HttpClient | None,
        urls: dict[str, list[str]],
        in_flight: Callable[[], int | None],
    ) -> None:
        """While a person watches ``progress`` (a terminal): set its status line every
        ``STATUS_SECONDS``, and poll ``/stats`` of the servers in ``urls`` (name -> replica
        URLs) for their circuits, until ``stop_live``."""
        if self._tasks or not progress.watched:
            return
        self._tasks.append(asyncio.create_task(self._showing(progress, client, in_flight)))
        if urls:
            self._tasks.append(asyncio.create_task(self._polling(urls)))

    async def stop_live(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:  # the polling broke: logged, never the run's failure
                    log.exception("polling the servers' /stats failed")

    async def _showing(
        self,
        progress: RunProgress,
        client: HttpClient | None,
        in_flight: Callable[[], int | None],
    ) -> None:
        while True:
            try:
                progress.set_status(self.status_line(client, in_flight()))
            except Exception:  # the status line informs; it must never stop a run
                log.exception("the progress bar's status line failed")
                return
            await asyncio.sleep(STATUS_SECONDS)

    async def _polling(self, urls: dict[str, list[str]]) -> None:
        once = RetryPolicy(max_attempts=1, attempt_timeout=POLL_TIMEOUT)
        labels = [
            (name if len(replicas) == 1 else f"{name}[{i}]", url)
            for name, replicas in urls.items()
            for i, url in enumerate(replicas)
        ]
        targets = [(label, Target.single(f"{label}.stats", url, once)) for label, url in labels]
        async with HttpClient(limit=64) as client:
            while True:
                answers = await asyncio.gather(
                    *(client.call(t, "/stats", {}, deadline=POLL_TIMEOUT) for _, t in targets),
                    return_exceptions=True,
                )
                polled: dict[str, str] = {}
                for (caller, _), answer in zip(targets, answers, strict=True):
                    if isinstance(answer, dict):
                        polled.update(_breakers_of(caller, answer.get("calls")))
                self.breakers = polled
                await asyncio.sleep(POLL_SECONDS)


def _breakers_of(caller: str, calls: Any) -> dict[str, str]:
    """``caller->server[replica]`` -> state from one ``/stats`` answer's ``calls``."""
    out: dict[str, str] = {}
    if not isinstance(calls, dict):
        return out
    for server, entry in list(calls.items())[:MAX_NAMES]:
        if not isinstance(entry, dict):
            continue
        states = entry.get("breakers")
        if isinstance(states, list) and len(states) > 1:
            for i, state in enumerate(states[:MAX_NAMES]):
                out[f"{caller}->{server}[{i}]"] = str(state)
        elif isinstance(entry.get("breaker"), str):
            out[f"{caller}->{server}"] = entry["breaker"]
    return out


def _secs(seconds: float) -> str:
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.2f}s"
