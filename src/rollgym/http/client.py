"""The HTTP client every rollgym process uses to call another server.

One client per process or event loop. The send path is a chain of small steps::

    call / call_json / call_stream / call_with_cookies   thin wrappers, each naming its reader
      -> _call: the payload as JSON, the call's span when traced
        -> _send: the retry loop, which only does the effects
                          ├─ _admit      breaker and pinning: may the attempt go, and where
                          ├─ transport   one attempt (``Transport.send(Request)``) -> decoded JSON
                          └─ classify    after a failure: retry after how long, or which error

Each ``Target`` carries the called server's own retry policy; a retry budget per target and a
circuit breaker per replica URL keep a failing server from being hammered, while the target's
healthy replicas go on taking its calls (``rollgym.http.replicas`` chooses among them). The
transport (``default_transport()`` unless one is given: the lean one, aiohttp's behind it for
``https``) is the seam where an attempt leaves the process; ``on_attempt`` hears of every
attempt sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

import rollgym.http.limits as answer_limits
from rollgym import tracing
from rollgym.config import RetryPolicy
from rollgym.errors import ConnectError, ReplicaDown, RollgymError
from rollgym.http.answer import (
    AttemptFailed,
    JsonValue,
    Streamed,
    read_object,
    read_stream,
    read_value,
    status_error,
)
from rollgym.http.breaker import CLOSED, CircuitBreaker
from rollgym.http.budget import RetryBudget
from rollgym.http.classify import budget_exhausted, circuit_open, classify, replica_lost
from rollgym.http.default import default_transport
from rollgym.http.failed_attempts import failed as failed_attempt
from rollgym.http.replicas import ReplicaSet
from rollgym.http.scrub import header_secrets, scrubbed
from rollgym.http.transport import RawAnswer, Request, Transport
from rollgym.prometheus.latency import CallLatency

__all__ = [
    "REPLICA_DOWN_SECONDS",
    "HttpClient",
    "JsonValue",
    "Streamed",
    "Target",
    "TargetStats",
    "status_error",
]

log = logging.getLogger("rollgym.http")

REPLICA_DOWN_SECONDS = 10.0
"""How long a replica that refused a connection gets no new requests before it is tried again."""

Reader = Callable[[RawAnswer, str, str, str], Any]
"""Decodes one answer (answer, server, url, endpoint), or raises ``AttemptFailed``."""


@dataclass(frozen=True)
class Target:
    """A server to call: its logical name, its replica URLs and its retry policy."""

    name: str
    urls: tuple[str, ...]
    policy: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def single(cls, name: str, url: str, policy: RetryPolicy | None = None) -> Target:
        return cls(name, (url.rstrip("/"),), policy or RetryPolicy())


@dataclass
class TargetStats:
    """Counters for one target, reported in metrics."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    budget_refused: int = 0
    circuit_rejected: int = 0


@dataclass
class _TargetState:
    policy: RetryPolicy
    budget: RetryBudget
    breakers: tuple[CircuitBreaker, ...]  # one per replica, in the order of the target's URLs
    replicas: ReplicaSet
    stats: TargetStats
    caps: answer_limits.Caps  # the policy's answer limits, for the transport
    latency: CallLatency = field(default_factory=CallLatency)  # read by /metrics


class HttpClient:
    """Pooled JSON-over-HTTP client with per-target retry policy and budget, and a circuit
    breaker per replica.

    ``transport`` replaces the default one (``default_transport()``; ``limit`` and
    ``keepalive_timeout`` are its pool settings); a transport passed in stays its owner's to
    close. ``on_attempt(seconds)``, if given, is called after every attempt sent (answered or
    not) with the seconds the transport took, in the caller's task (the agent times its hops
    with it).
    """

    def __init__(
        self,
        *,
        limit: int = 8192,
        keepalive_timeout: float = 30.0,
        transport: Transport | None = None,
        on_attempt: Callable[[float], None] | None = None,
    ) -> None:
        self._owned: Transport | None = None
        if transport is None:
            transport = self._owned = default_transport(
                limit=limit, keepalive_timeout=keepalive_timeout
            )
        self._transport = transport
        self._on_attempt = on_attempt
        self._targets: dict[str, _TargetState] = {}

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        close = getattr(self._owned, "close", None)
        if close is not None:
            await close()

    def _state(self, target: Target) -> _TargetState:
        state = self._targets.get(target.name)
        policy = target.policy
        if state is not None and state.replicas.urls is target.urls and state.policy is policy:
            return state  # the usual case: the same Target again; no model comparisons
        if (
            state is None
            or state.replicas.urls != target.urls
            or state.budget.config != policy.budget
            or state.breakers[0].config != policy.breaker
        ):
            state = _TargetState(
                policy=policy,
                budget=RetryBudget(policy.budget),
                breakers=_breakers(target, policy),
                replicas=ReplicaSet(target.urls),
                stats=state.stats if state else TargetStats(),
                caps=answer_limits.Caps(policy.answer_limits),
                latency=state.latency if state else CallLatency(),
            )
            self._targets[target.name] = state
        if state.policy is not policy:
            state.caps = answer_limits.Caps(policy.answer_limits)
        state.policy = policy  # an equal policy in a new object: next time, the fast path
        return state

    def stats(self) -> dict[str, TargetStats]:
        return {name: s.stats for name, s in self._targets.items()}

    def latency(self, name: str) -> CallLatency | None:
        """The seconds of the calls to target ``name`` (``None`` before its first call)."""
        state = self._targets.get(name)
        return state.latency if state else None

    def replicas(self, name: str) -> ReplicaSet | None:
        """The replica set of target ``name`` (``None`` before its first call)."""
        state = self._targets.get(name)
        return state.replicas if state else None

    def mark_down(self, target: Target, url: str, seconds: float | None = None) -> None:
        """Send no new calls to replica ``url`` of ``target`` (for ``seconds``, or for good),
        keeping its breaker and the target's budget and load counts."""
        replicas = self._state(target).replicas
        replicas.mark_down(replicas.index(url), seconds)

    def live_urls(self, target: Target) -> list[str]:
        """The replicas of ``target`` not marked down."""
        return self._state(target).replicas.live()

    def breaker(self, name: str) -> CircuitBreaker | None:
        """The breaker of target ``name`` (with several URLs: its first replica's; see
        ``breakers``), or ``None`` before the target's first call."""
        state = self._targets.get(name)
        return state.breakers[0] if state else None

    def breakers(self, name: str) -> tuple[CircuitBreaker, ...]:
        """The breakers of target ``name``, one per replica URL in order (named ``NAME[i]``
        when there are several); empty before the target's first call."""
        state = self._targets.get(name)
        return state.breakers if state else ()

    def call(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        sticky: str | None = None,
        pin: bool = False,
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        """POST ``payload`` as JSON to ``endpoint`` of ``target`` and return the JSON object
        it answers (any other JSON is a ``ProtocolError``, retried like a garbled answer).

        Retries under the target's policy; raises a ``RollgymError`` whose ``attempts`` says how
        many attempts were made. ``deadline`` (seconds) caps the total time further. Calls with
        the same ``sticky`` key go to the same replica; with ``pin`` they never fail over (the
        replica holds state of theirs, e.g. a session), and a lost replica fails them at once.

        Not ``async`` itself (nor ``call_json``, ``call_stream``): it returns the retry loop's
        coroutine, one frame less for each of the thousands of calls a collector holds.
        """
        return self._call(target, endpoint, payload, headers, deadline, sticky, pin, read_object)

    def call_stream(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        *,
        idle_timeout: float | None,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
    ) -> Coroutine[Any, Any, Streamed]:
        """POST ``payload`` to an endpoint that answers server-sent events (a chat completion
        with ``"stream": true``) and return the events once ``data: [DONE]`` has come.

        ``idle_timeout`` bounds every wait for the next bytes (the answer's headers included):
        a server that goes silent that long fails the attempt as a ``ReadTimeout``, retried
        under the target's policy, while one that keeps sending may run for the whole attempt
        timeout. A cut stream, or an error event in it, is a failed attempt too."""
        return self._call(
            target, endpoint, payload, headers, deadline, None, False, read_stream,
            idle_timeout=idle_timeout,
        )  # fmt: skip

    def call_json(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        sticky: str | None = None,
        pin: bool = False,
    ) -> Coroutine[Any, Any, JsonValue]:
        """``call`` for an endpoint that may answer any JSON value (a list, a string, ...)."""
        return self._call(target, endpoint, payload, headers, deadline, sticky, pin, read_value)

    async def call_with_cookies(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        sticky: str | None = None,
        pin: bool = False,
    ) -> tuple[JsonValue, dict[str, str]]:
        """``call_json``, plus the cookies the answer set (name -> value). The client keeps no
        cookie jar: a caller that holds a session in a cookie sends it back itself."""
        value, cookies = await self._call(
            target, endpoint, payload, headers, deadline, sticky, pin, read_value,
            with_cookies=True,
        )  # fmt: skip
        return value, dict(cookies)

    def _call(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        headers: Mapping[str, str] | None,
        deadline: float | None,
        sticky: str | None,
        pin: bool,
        read: Reader,
        *,
        idle_timeout: float | None = None,
        with_cookies: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        """The one call path of every ``call*``: the payload as JSON (bytes are sent as they
        are), the retry loop's coroutine, inside the call's span when traced
        (``rollgym.tracing``)."""
        body = payload if isinstance(payload, (bytes, bytearray)) else orjson.dumps(payload)
        sent = self._send(
            target, endpoint, body, headers, deadline, sticky, pin, read,
            idle_timeout=idle_timeout, with_cookies=with_cookies,
        )  # fmt: skip
        tracer = tracing.active
        return sent if tracer is None else tracer.call(sent, target.name, endpoint)

    async def _send(
        self,
        target: Target,
        endpoint: str,
        body: bytes | bytearray,
        headers: Mapping[str, str] | None,
        deadline: float | None,
        sticky: str | None,
        pin: bool,
        read: Reader,
        *,
        idle_timeout: float | None = None,
        with_cookies: bool = False,
    ) -> Any:
        """The retry loop: the decoded answer (``with_cookies``: and the cookies it set), or
        the final error."""
        policy = target.policy
        state = self._state(target)
        stats = state.stats
        stats.calls += 1
        idempotent, max_attempts, attempt_timeout = policy.for_endpoint(endpoint)
        total = policy.deadline if deadline is None else min(policy.deadline, deadline)
        start = time.monotonic()
        last: RollgymError | None = None
        attempt = 0
        while True:
            attempt += 1
            replica = self._admit(target, state, endpoint, attempt, sticky, pin, last)
            breaker = state.breakers[replica]
            stats.attempts += 1
            if attempt == 1:
                # The budget counts calls; retries are what it limits (see RetryBudget).
                state.budget.record_request()
            left = total - (time.monotonic() - start)
            url = target.urls[replica] + endpoint
            # Traced (rollgym.tracing): the attempt's client span, sent as ``traceparent``.
            tracer = tracing.active
            span = None if tracer is None else tracer.attempt(target.name, endpoint, url, attempt)
            state.replicas.begin(replica)
            try:
                # One attempt, inline rather than a method of its own: a call in flight holds
                # its coroutines' frames, and a collector holds thousands of calls at once.
                # The called server's answer limits, for the transport to read where the bytes
                # arrive (``rollgym.http.limits``: no wider seam for every wrapping transport).
                limits = answer_limits.sending(state.caps)
                hook = self._on_attempt
                sent_at = time.monotonic() if hook is not None else 0.0
                try:
                    raw = await self._transport.send(
                        Request(
                            url,
                            body,
                            headers if span is None else span.headers(headers),
                            min(attempt_timeout, left),
                            policy.connect_timeout,
                            target.name,
                            endpoint,
                            idle_timeout,
                        )
                    )
                except RollgymError as sent:  # the transport's: no answer
                    # A replica found down by its watch (``rollgym.models.liveness``) is
                    # final here: its breaker is open, another replica may take the call.
                    raise AttemptFailed(sent, final=isinstance(sent, ReplicaDown)) from sent
                finally:
                    answer_limits.done(limits)
                    state.replicas.end(replica)
                    if hook is not None:
                        hook(time.monotonic() - sent_at)
                value = read(raw, target.name, url, endpoint)
            except AttemptFailed as failed:  # no answer, or one ``read`` found unusable
                failure = failed
            except BaseException:
                # Cancelled mid-attempt: there is no outcome to report, but a half-open probe
                # that never reports would keep the circuit shut for good.
                breaker.release()
                if span is not None:
                    span.cancelled()
                raise
            else:
                state.latency.ok.observe(time.monotonic() - start)
                # Every answered attempt reports to the breaker: successes reset its count of
                # failures in a row, and a successful half-open probe closes it.
                breaker.record(True)
                if span is not None:
                    span.answered(raw.status)
                return (value, raw.cookies) if with_cookies else value
            err = scrubbed(failure.error, header_secrets(headers))
            failed_attempt(err)  # a caller that meters its calls sees every failed attempt
            if isinstance(err, ConnectError) and len(target.urls) > 1:
                # Nothing listens there (its process or node is gone): send nothing new to
                # that replica for a while; this call's next attempt goes to another one.
                state.replicas.mark_down(replica, REPLICA_DOWN_SECONDS)
            # A read timeout is the total deadline's only if no shorter idle timeout could
            # have fired first; if it was, the next attempt finds no time left anyway.
            cut = left <= attempt_timeout and (idle_timeout is None or left <= idle_timeout)
            decision = classify(
                err, policy, idempotent=idempotent, max_attempts=max_attempts, attempt=attempt,
                time_left=total - (time.monotonic() - start), deadline=total,
                timeout_was_deadline=cut,
                retry_after=failure.retry_after, final=failure.final,
            )  # fmt: skip
            refused = decision.retry and not state.budget.try_retry()
            ends = refused or not decision.retry
            _report(breaker, decision.blame, ends, err)
            if span is not None:
                span.failed(err, not ends)
            if ends:
                stats.failures += 1
                final = decision.error
                if refused:
                    stats.budget_refused += 1
                    final = budget_exhausted(final)
                state.latency.failed.observe(time.monotonic() - start)
                log.debug(
                    "%s %s: giving up after %d attempt(s): %s", target.name, endpoint, attempt,
                    final,
                )  # fmt: skip
                raise final
            stats.retries += 1
            log.debug(
                "%s %s: attempt %d/%d failed (%s); retrying in %.3fs",
                target.name, endpoint, attempt, max_attempts, decision.error, decision.delay,
            )  # fmt: skip
            last = decision.error
            if span is None:
                await asyncio.sleep(decision.delay)
            else:  # traced: the wait is a span of its own
                await span.wait(decision.delay)

    def _admit(
        self,
        target: Target,
        state: _TargetState,
        endpoint: str,
        attempt: int,
        sticky: str | None,
        pin: bool,
        last: RollgymError | None,
    ) -> int:
        """The replica (its index) for attempt number ``attempt``, or the error that stops the
        call: its replica's breaker refused it (with several replicas, each breaker is asked
        first, so this means every one is open, or a pinned call's own)."""
        replicas = state.replicas
        replica = replicas.pick(sticky, state.breakers, pin=pin)
        if pin and len(target.urls) > 1 and replicas.is_down(replica):
            state.stats.failures += 1
            url = target.urls[replica]
            raise replica_lost(target.name, endpoint, url, attempts=attempt, last=last)
        breaker = state.breakers[replica]
        if not breaker.allow():
            state.stats.circuit_rejected += 1
            state.stats.failures += 1
            raise circuit_open(
                target.name, endpoint, attempts=attempt - 1, last=last, why=breaker.reason,
                cause=breaker.cause,
            )  # fmt: skip
        return replica


def _breakers(target: Target, policy: RetryPolicy) -> tuple[CircuitBreaker, ...]:
    """A breaker per replica of ``target``: one sick replica's circuit opens for it alone."""
    if len(target.urls) == 1:
        return (CircuitBreaker(target.name, policy.breaker),)
    return tuple(
        CircuitBreaker(f"{target.name}[{i}]", policy.breaker) for i in range(len(target.urls))
    )


def _report(breaker: CircuitBreaker, blame: bool, ends: bool, error: RollgymError) -> None:
    """Tell the breaker about a failed attempt. A failure the server is not to blame for (a
    4xx: it answered) counts as healthy. The breaker counts failed calls, not attempts: a burst
    of errors that retries absorb is no reason to stop calling a server; but a failed half-open
    probe must reopen the circuit at once."""
    if not blame:
        breaker.record(True)
    elif ends or breaker.state != CLOSED:
        breaker.record(False, error)
