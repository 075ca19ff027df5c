"""The HTTP client every rollgym process uses to call another server.

One pooled aiohttp session per client (one client per process or event loop), explicit limits
and timeouts, and the send path as a chain of small steps::

    call -> _call_with_retries -> _attempt -> aiohttp

Each ``Target`` carries the called server's own retry policy; a retry budget and a circuit
breaker per target keep a failing server from being hammered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from rollgym.config import RetryPolicy
from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    DeadlineExceeded,
    HTTPStatusError,
    ReadTimeout,
    RollgymError,
    is_known_type,
    scrub_secrets,
)
from rollgym.http.balancer import Balancer
from rollgym.http.breaker import CircuitBreaker
from rollgym.http.budget import RetryBudget
from rollgym.http.policy import is_transient, parse_retry_after, retry_delay
from rollgym.http.translate import raise_translated

log = logging.getLogger("rollgym.http")

REPLICA_DOWN_SECONDS = 10.0
"""How long a replica that refused a connection gets no new requests before it is tried again."""

JSON_HEADERS = {"content-type": "application/json"}


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
    breaker: CircuitBreaker
    balancer: Balancer
    stats: TargetStats


class HttpClient:
    """Pooled JSON-over-HTTP client with per-target retry policy, budget and breaker."""

    def __init__(self, *, limit: int = 8192, keepalive_timeout: float = 30.0) -> None:
        # keepalive_timeout stays below the servers' (uvicorn: 75 s, set by rollgym.server), so
        # the client drops an idle connection before the server closes it under our feet.
        self._limit = limit
        self._keepalive = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None
        self._targets: dict[str, _TargetState] = {}

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                keepalive_timeout=self._keepalive,
                enable_cleanup_closed=True,
            )
            # No session-wide timeout: every request sets its own (aiohttp's default of 300 s
            # total is wrong both for minutes-long LLM calls and for fast tool calls).
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
                skip_auto_headers=("User-Agent",),
                # aiohttp always sends ``Accept-Encoding: gzip, deflate``, so a server behind
                # GZip middleware answers compressed: the body must be decompressed to be read.
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def _state(self, target: Target) -> _TargetState:
        state = self._targets.get(target.name)
        policy = target.policy
        if state is not None and state.balancer.urls is target.urls and state.policy is policy:
            return state  # the usual case: the same Target again; no model comparisons
        if (
            state is None
            or state.balancer.urls != target.urls
            or state.budget.config != policy.budget
            or state.breaker.config != policy.breaker
        ):
            state = _TargetState(
                policy=policy,
                budget=RetryBudget(policy.budget),
                breaker=CircuitBreaker(target.name, policy.breaker),
                balancer=Balancer(target.urls),
                stats=state.stats if state else TargetStats(),
            )
            self._targets[target.name] = state
        state.policy = policy  # an equal policy in a new object: next time, the fast path
        return state

    def stats(self) -> dict[str, TargetStats]:
        return {name: s.stats for name, s in self._targets.items()}

    def mark_down(self, target: Target, url: str, seconds: float | None = None) -> None:
        """Send no new calls to replica ``url`` of ``target`` (for ``seconds``, or for good),
        keeping the target's breaker, budget and load counts."""
        self._state(target).balancer.mark_down(url, seconds)

    def live_urls(self, target: Target) -> list[str]:
        """The replicas of ``target`` not marked down."""
        balancer = self._state(target).balancer
        return [u for u in target.urls if not balancer.is_down(u)]

    def breaker(self, name: str) -> CircuitBreaker | None:
        state = self._targets.get(name)
        return state.breaker if state else None

    async def call(
        self,
        target: Target,
        endpoint: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        sticky: str | None = None,
        pin: bool = False,
    ) -> Any:
        """POST ``payload`` as JSON to ``endpoint`` of ``target`` and return the decoded JSON.

        Retries under the target's policy; raises a ``RollgymError`` whose ``attempts`` says how
        many attempts were made. ``deadline`` (seconds) caps the total time further. Calls with
        the same ``sticky`` key go to the same replica; with ``pin`` they never fail over (the
        replica holds state of theirs, e.g. a session), and a lost replica fails them at once.
        """
        body = payload if isinstance(payload, (bytes, bytearray)) else orjson.dumps(payload)
        return await self._call_with_retries(target, endpoint, body, headers, deadline, sticky, pin)

    async def _call_with_retries(
        self,
        target: Target,
        endpoint: str,
        body: bytes | bytearray,
        headers: Mapping[str, str] | None,
        deadline: float | None,
        sticky: str | None,
        pin: bool = False,
    ) -> Any:
        policy = target.policy
        state = self._state(target)
        stats = state.stats
        stats.calls += 1
        idempotent, max_attempts, attempt_timeout = policy.for_endpoint(endpoint)
        total = policy.deadline if deadline is None else min(policy.deadline, deadline)
        start = time.monotonic()
        secrets = _header_secrets(headers)
        last: RollgymError | None = None
        attempt = 0
        while True:
            attempt += 1
            if not state.breaker.allow():
                stats.circuit_rejected += 1
                stats.failures += 1
                raise CircuitOpen(
                    f"circuit for {target.name} is open after repeated failures; not sent",
                    server=target.name, endpoint=endpoint, method="POST",
                    attempts=attempt - 1 or 1, origin=last,
                )  # fmt: skip
            remaining = total - (time.monotonic() - start)
            base = state.balancer.pick(sticky, pin=pin)
            if pin and len(target.urls) > 1 and state.balancer.is_down(base):
                stats.failures += 1
                raise ConnectError(
                    f"{target.name} replica {base} is down, and this call's state lived there",
                    server=target.name, endpoint=endpoint, method="POST", url=base,
                    attempts=attempt, retryable=False, origin=last,
                )  # fmt: skip
            url = base + endpoint
            stats.attempts += 1
            if attempt == 1:
                # The budget counts calls; retries are what it limits (see RetryBudget).
                state.budget.record_request()
            try:
                result = await self._attempt(
                    target.name, url, endpoint, body, headers, min(attempt_timeout, remaining),
                    policy.connect_timeout, state.balancer,
                )  # fmt: skip
            except _AttemptFailed as failed:
                err, retry_after, final = failed.error, failed.retry_after, failed.final
                if secrets:
                    scrub_secrets(err, secrets)
                if isinstance(err, ConnectError) and len(target.urls) > 1:
                    # Nothing listens there (its process or node is gone): send nothing new to
                    # that replica for a while; this call's next attempt goes to another one.
                    state.balancer.mark_down(base, REPLICA_DOWN_SECONDS)
            except BaseException:
                # Cancelled mid-attempt: there is no outcome to report, but a half-open probe
                # that never reports would keep the circuit shut for good.
                state.breaker.release()
                raise
            else:
                # Every answered attempt reports to the breaker: successes reset its count of
                # failures in a row, and a successful half-open probe closes it.
                state.breaker.record(True)
                return result
            healthy = not _counts_against_server(err)
            if healthy or state.breaker.state != "closed":
                # A 4xx is the caller's problem: the server answered, so it counts as healthy.
                # A failed half-open probe must reopen the circuit at once.
                state.breaker.record(healthy)
            if isinstance(err, ReadTimeout) and remaining <= attempt_timeout:
                err = DeadlineExceeded(
                    f"{target.name}: total deadline of {total:g}s ran out",
                    server=target.name, endpoint=endpoint, method="POST", url=err.url,
                    retryable=False, origin=err,
                )  # fmt: skip
            err.attempts = attempt
            delay = retry_delay(
                err, policy, idempotent=idempotent, attempt=attempt, retry_after=retry_after
            )
            transient = is_transient(err, policy, idempotent) and not final
            if final:
                # The server said its answer is final (e.g. a gateway whose own upstream
                # already used its retries): retrying here would multiply the attempts.
                delay = None
            err.retryable = transient
            if delay is None or attempt >= max_attempts:
                if not healthy and state.breaker.state == "closed":
                    # The breaker counts failed calls, not attempts: a burst of transient
                    # errors that retries absorb is no reason to stop calling a server.
                    state.breaker.record(False)
                stats.failures += 1
                log.debug(
                    "%s %s: giving up after %d attempt(s): %s", target.name, endpoint, attempt, err
                )
                raise err
            if time.monotonic() - start + delay >= total:
                stats.failures += 1
                raise DeadlineExceeded(
                    f"{target.name}: no time left for another attempt within {total:g}s",
                    server=target.name, endpoint=endpoint, method="POST", url=err.url,
                    attempts=attempt, origin=err,
                )  # fmt: skip
            if not state.budget.try_retry():
                stats.budget_refused += 1
                stats.failures += 1
                raise BudgetExhausted(
                    f"retry budget for {target.name} is spent; not retrying {err.type}",
                    server=target.name, endpoint=endpoint, method="POST", url=err.url,
                    status=err.status, body=err.body, attempts=attempt, origin=err,
                )  # fmt: skip
            stats.retries += 1
            log.debug(
                "%s %s: attempt %d/%d failed (%s); retrying in %.3fs",
                target.name, endpoint, attempt, max_attempts, err, delay,
            )  # fmt: skip
            last = err
            await asyncio.sleep(delay)

    async def _attempt(
        self,
        server: str,
        url: str,
        endpoint: str,
        body: bytes | bytearray,
        headers: Mapping[str, str] | None,
        timeout: float,
        connect_timeout: float,
        balancer: Balancer,
    ) -> Any:
        session = self._get_session()
        hdrs = {**JSON_HEADERS, **headers} if headers else JSON_HEADERS
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        balancer.begin(url)
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                async with session.post(
                    url, data=body, headers=hdrs, timeout=client_timeout
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
                    retry_after = resp.headers.get("Retry-After") if status >= 400 else None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            try:
                raise_translated(
                    exc, server=server, method="POST", url=url, endpoint=endpoint, timeout=timeout
                )
            except RollgymError as err:
                raise _AttemptFailed(err) from exc
            raise  # unreachable: raise_translated always raises
        finally:
            balancer.end(url)
        if status >= 400:
            raise _AttemptFailed(
                status_error(server, url, endpoint, status, raw),
                parse_retry_after(retry_after),
                final=_declared_final(raw),
            )
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            try:
                raise_translated(
                    exc, server=server, method="POST", url=url, endpoint=endpoint, timeout=timeout
                )
            except RollgymError as err:
                # Through with_fields, so the body is bounded and redacted like any other.
                raise _AttemptFailed(err.with_fields(status=status, body=raw)) from exc
            raise


class _AttemptFailed(Exception):
    """One failed attempt, with the ``Retry-After`` seconds the server asked for (if any)."""

    def __init__(
        self, error: RollgymError, retry_after: float | None = None, *, final: bool = False
    ) -> None:
        self.error = error
        self.retry_after = retry_after
        self.final = final


_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
)
_MIN_SECRET = 6  # shorter values would blank out ordinary words


def _header_secrets(headers: Mapping[str, str] | None) -> list[str]:
    """Credential values this request carries; never let an echo of them into an error."""
    if not headers:
        return []
    out: list[str] = []
    for name, value in headers.items():
        if name.lower() in _SECRET_HEADERS:
            out.append(value)
            token = value.split(" ", 1)[-1].strip()  # "Bearer KEY" -> KEY
            if len(token) >= _MIN_SECRET:
                out.append(token)
    return sorted(set(out), key=len, reverse=True)


def _declared_final(raw: bytes) -> bool:
    """Whether a rollgym error body says ``"retryable": false`` (only rollgym servers say so)."""
    if b'"retryable"' not in raw:
        return False
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    inner = data.get("error") if isinstance(data, dict) else None
    return isinstance(inner, dict) and inner.get("retryable") is False


def status_error(server: str, url: str, endpoint: str, status: int, raw: bytes) -> HTTPStatusError:
    """An ``HTTPStatusError`` from a non-2xx answer; a rollgym error body becomes the origin."""
    message = f"{server} answered {status} on POST {endpoint}"
    origin: RollgymError | None = None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        inner = data["error"]
        if inner.get("message"):
            message += f": {inner['message']}"
        if isinstance(inner.get("origin"), dict):
            origin = RollgymError.from_dict(inner["origin"])
        elif is_known_type(inner.get("type")) and inner.get("type") != "http_status":
            # The server's own typed error (a verify deadline, a crash): keep it as the cause.
            origin = RollgymError.from_dict(inner)
    elif isinstance(data, dict) and isinstance(data.get("detail"), (str, list)):
        message += f": {str(data['detail'])[:300]}"
    return HTTPStatusError(
        message, status=status, body=raw, url=url, method="POST", server=server,
        endpoint=endpoint, origin=origin,
    )  # fmt: skip


def _counts_against_server(err: RollgymError) -> bool:
    if isinstance(err, HTTPStatusError):
        if err.origin is not None and err.origin.server not in (None, err.server):
            # A gateway reporting another server's failure (an agent's 502 for a broken model):
            # the gateway itself is healthy, and the other server has its own breaker.
            return False
        return (err.status or 0) >= 500
    return err.type in ("connect_error", "connection_lost", "read_timeout", "protocol_error")
