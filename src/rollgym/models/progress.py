"""Whether a replica's engine makes progress: its token counters at ``GET /metrics``.

vLLM's API server can answer its health checks while its engine makes no progress (a wedged
engine, a deadlocked worker), and a whole answer sends nothing until it is done, so neither a
probe nor silence tells such a replica from a long generation. Its Prometheus counters do:
vLLM exports ``vllm:generation_tokens_total`` and ``vllm:prompt_tokens_total`` (counters) and
``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges); SGLang, started with
``--enable-metrics``, ``sglang:generation_tokens_total``, ``sglang:prompt_tokens_total`` and
``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``.

``Progress`` keeps, per replica, the sum of the token counters and when it last moved. While the
proxy has calls in flight there, a replica whose counters stood still for ``stall_timeout``
seconds, with requests running or waiting in its engine (or, without those gauges, with the
proxy's calls in flight), is stalled. So is a replica one of whose engines (vLLM's
data-parallel engines label each sample ``engine="N"``) holds requests while its own counters
stand still that long, whatever the others do: the sum alone would hide a frozen engine 0
behind a busy engine 1. A replica whose engine is idle (nothing running or waiting) is not: a
call it lost is ``rollgym.models.hedge``'s case (a hedge that reaches a live
engine moves its counters). Except: vLLM's engine reports those gauges itself, with its steps,
so an engine that stopped while idle (seen with vLLM 0.32: ``SIGSTOP`` of its ``EngineCore``;
its API server answers ``/ping`` 200 and ``/metrics``) still says it is idle while calls pile
up in front of it; a call sent since the counters last moved that has waited ``stall_timeout``
with them standing still never reached the engine, and the replica is stalled too (without
this, each such call waited for its attempt timeout). An upstream without these
counters (``/metrics`` answers 404, e.g. OpenAI; or names none of them) is not watched for
progress at all: its calls are bounded by the liveness probe, the hedge and the attempt timeout,
as before.

A limit: vLLM counts a request's prompt tokens when its prefill ends (with its first output
token), and exports no counter that moves with each step of a chunked prefill, so one prefill
longer than ``stall_timeout`` with nothing else in the engine reads as a stall; raise
``stall_timeout`` above the longest prefill expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:prompt_tokens_total",
)
"""The counters whose sum is a replica's progress (prompt tokens too: a long prefill is work)."""
BUSY = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)
"""The gauges whose sum is how many requests the engine holds."""

STALL_TIMEOUT_S = 45.0
"""Seconds without progress, with work in flight, before a replica is stalled (the proxy's
``stall_timeout``): with the heartbeat every 5 s, a stall is caught within a minute."""


_ENGINE = re.compile(r'(?:^|[{,\s])engine="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Reading:
    """One scrape: the counters' sum, and the requests the engine holds (``None``: no such
    gauge); ``engines``: the same per ``engine`` label, when samples carry one (vLLM's
    data-parallel engines), each ``(label, tokens, busy)``."""

    tokens: float
    busy: float | None
    engines: tuple[tuple[str, float, float | None], ...] = ()


def read_metrics(text: str) -> Reading | None:
    """The reading of a Prometheus text exposition (``None``: it has none of ``COUNTERS``).
    Samples are grouped by their ``engine`` label alone (other labels, such as
    ``model_name``, are summed)."""
    tokens: dict[str | None, float] = {}
    busy: dict[str | None, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, labels, values = _sample(line)
        if name not in COUNTERS and name not in BUSY:
            continue
        try:
            value = float(values[0])
        except (IndexError, ValueError):
            continue
        engine = _ENGINE.search(labels)
        key = None if engine is None else engine.group(1)
        into = tokens if name in COUNTERS else busy
        into[key] = into.get(key, 0.0) + value
    if not tokens:
        return None
    engines = tuple(
        (key, tokens.get(key, 0.0), busy.get(key) if busy else None)
        for key in sorted(k for k in {*tokens, *busy} if k is not None)
    )
    return Reading(sum(tokens.values()), sum(busy.values()) if busy else None, engines)


def _sample(line: str) -> tuple[str, str, list[str]]:
    """The metric name of one sample line, its labels (``{...}``, or ""), and what follows
    them (value, timestamp)."""
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = line.rfind("}")
        return line[:brace], line[brace : close + 1], line[close + 1 :].split()
    if space == -1:
        return line, "", []
    return line[:space], "", line[space:].split()


class Progress:
    """When a replica's counters last moved; ``stalled`` says for how long they stood still
    (see the module docstring)."""

    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self._tokens: float | None = None
        self._moved = 0.0
        self._last: Reading | None = None  # the last reading, kept across restarts
        self._changed = 0.0  # when they were last seen to move (or calls came to an idle one)
        self._engines: dict[str, tuple[float, float]] = {}  # label: (tokens, since when)
        self.engine: str | None = None
        """The engine whose stall ``stalled`` last reported (``None``: the replica's sum)."""

    def restart(self, now: float) -> None:
        """Calls are in flight again after none were: idle time before now is no stall."""
        self._tokens = None
        self._moved = self._changed = now
        self._engines.clear()

    def moved(self, reading: Reading | None) -> bool | None:
        """Whether ``reading``'s counters differ from the last reading's, any engine's (``None``:
        nothing to compare, no reading now or none before). Call it before ``stalled``."""
        last = self._last
        if reading is None or last is None:
            return None
        counters = [engine[:2] for engine in reading.engines]
        return reading.tokens != last.tokens or counters != [e[:2] for e in last.engines]

    def stalled(self, reading: Reading, now: float, sent: Iterable[float] = ()) -> float | None:
        """Seconds the counters have stood still with work in the engine (or in one of its
        engines), once that reaches ``stall_timeout`` (else ``None``); ``sent``: when the calls
        in flight were sent."""
        engine = self._engine_stalled(reading, now)
        whole = self._whole_stalled(reading, now, sent)
        self.engine = None if engine is None or (whole or 0.0) >= engine[1] else engine[0]
        if engine is None:
            return whole
        return max(whole or 0.0, engine[1])

    def _engine_stalled(self, reading: Reading, now: float) -> tuple[str, float] | None:
        """The engine holding requests whose counters stood still longest, once for
        ``stall_timeout``, and for how long."""
        worst: tuple[str, float] | None = None
        for label, tokens, busy in reading.engines:
            seen = self._engines.get(label)
            if seen is None or seen[0] != tokens or not busy:
                # Moved, first seen, or idle (an idle engine's stillness is no stall).
                self._engines[label] = (tokens, now)
                continue
            still = now - seen[1]
            if still >= self.stall_timeout and (worst is None or still > worst[1]):
                worst = (label, still)
        return worst

    def _whole_stalled(self, reading: Reading, now: float, sent: Iterable[float]) -> float | None:
        if self._last is not None and reading.tokens != self._last.tokens:
            self._changed = now  # the first reading after a restart compares with the last
        self._last = reading
        if self._tokens is None or reading.tokens != self._tokens:
            self._tokens = reading.tokens
            self._moved = now
            return None
        if reading.busy is not None and reading.busy <= 0:
            self._moved = now  # an idle engine is not stalled (a lost call is the hedge's)...
            # ... unless it stopped idle: calls sent since it last moved, not one started.
            unseen = [at for at in sent if at >= self._changed]
            waited = now - min(unseen) if unseen else 0.0
            return waited if waited >= self.stall_timeout else None
        still = now - self._moved
        return still if still >= self.stall_timeout else None
