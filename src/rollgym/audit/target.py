"""Talking to the audited environment through its own HTTP protocol, never trusting it.

One play of an answer on a row is what an agent does in a rollout: ``POST /seed_session`` with
the row, the plan's tools (``POST /<tool>``) in that session, then ``POST /verify`` with the row
and a Responses API ``response`` whose output holds the calls, their outputs and the answer as
an assistant message (the shape rollgym's tool agent sends). A Gymnasium-style environment
(``/reset`` + ``/step``, as ``rollgym check`` tells them apart) gets ``/reset`` then one
``/step`` with that response. The session travels as rollgym's header and as every cookie the
server sets, so a server that keeps its session in a cookie keeps it.

Every call has a timeout and one attempt: what the server answers is the finding. A 5xx, a
timeout, a reset connection or an answer that is no reward is a ``crash``; a 4xx is the server
refusing the answer (not scored, and no finding). A server that timed out ``MAX_TIMEOUTS``
times gets no more plays (they end ``skipped``), so a hung server costs seconds, not the audit.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from rollgym.audit.panel import ToolCall
from rollgym.config import AnswerLimits, BreakerConfig, RetryBudgetConfig, RetryPolicy
from rollgym.errors import DeadlineExceeded, HTTPStatusError, ReadTimeout, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.models.scripted import build_response
from rollgym.wire import HEADER_ROLLOUT, SESSION_HEADER

TIMEOUT = 30.0
"""Seconds one call may take by default (a verify that runs code gets this much)."""
MAX_TIMEOUTS = 3
CONCURRENCY = 8
"""Plays in flight on one server by default."""
_ANSWER_BYTES = 16 << 20


@dataclass(frozen=True)
class Outcome:
    """How one play ended: a ``reward``, or a ``crash`` (what went wrong, where), or
    ``refused`` (the server's 4xx), or ``skipped`` (the server had hung too often)."""

    reward: float | None = None
    crash: str | None = None
    refused: str | None = None
    skipped: bool = False
    outputs: tuple[Any, ...] = ()
    """What the plan's tool calls answered, in order."""


@dataclass
class Play:
    """One play's request, kept for a finding's example."""

    endpoint: str
    body: dict[str, Any] = field(default_factory=dict)


class Player(Protocol):
    """What the audit plays an environment through: rollgym's HTTP shape (``Environment``),
    or a dialect's (``AuditDialect``, e.g. OpenEnv's ``/ws`` session)."""

    gym: bool
    """No tools to call: the panel's ``tool_leak`` plans are not played."""

    async def detect(self) -> list[dict[str, Any]]:
        """The server's tools (the row's own are used first)."""
        ...

    async def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` as the panel reads it (an environment whose task is in its first
        observation gives it back as a message)."""
        ...

    async def play(
        self, row: dict[str, Any], answer: str, calls: Sequence[ToolCall] = (), *, last: Play
    ) -> Outcome: ...


class _Crash(Exception):
    def __init__(self, what: str, refused: bool = False, hung: bool = False) -> None:
        super().__init__(what)
        self.what, self.refused, self.hung = what, refused, hung


def audit_policy(timeout: float) -> RetryPolicy:
    """One attempt per call within ``timeout``: the audit records what the server did, and
    keeps calling a failing server (no breaker, no budget) to see every probe's fate."""
    return RetryPolicy(
        max_attempts=1,
        deadline=timeout,
        attempt_timeout=timeout,
        connect_timeout=min(5.0, timeout),
        budget=RetryBudgetConfig(enabled=False),
        breaker=BreakerConfig(enabled=False),
        answer_limits=AnswerLimits(body_bytes=_ANSWER_BYTES, decompressed_bytes=_ANSWER_BYTES),
    )


class Environment:
    """One audited server at ``url`` (named ``name`` in its errors), played through ``http``."""

    def __init__(
        self,
        http: HttpClient,
        name: str,
        url: str,
        *,
        timeout: float = TIMEOUT,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.http = http
        self.timeout = timeout
        self.target = Target.single(name, url, audit_policy(timeout))
        self.gym = False
        self.seedless = False
        """The server has no ``/seed_session`` (a 404 or 405 there): plays go to ``/verify``
        without a session, as to a stateless verifier."""
        self.timeouts = 0
        self._limit = asyncio.Semaphore(concurrency)
        self._plays = 0

    async def detect(self) -> list[dict[str, Any]]:
        """Which protocol the server speaks (``gym``), and its tools (``GET /tools``; none for
        a server without that route)."""
        try:
            await self._post("/reset", {}, {}, "detect")
            self.gym = True
        except _Crash as crash:
            # Only a 404 says "no such route"; a 4xx about the empty row means it has one.
            self.gym = crash.refused and not crash.what.startswith("404")
        if self.gym:
            return []
        try:
            tools, _ = await self._post("/tools", {}, {}, "detect")
        except _Crash:
            return []
        return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []

    async def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        return row

    async def play(
        self, row: dict[str, Any], answer: str, calls: Sequence[ToolCall] = (), *, last: Play
    ) -> Outcome:
        """Play ``answer`` (after ``calls``) on ``row`` in a session of its own; ``last`` is
        filled with the scoring request."""
        if self.timeouts >= MAX_TIMEOUTS:
            return Outcome(skipped=True)
        async with self._limit:
            if self.timeouts >= MAX_TIMEOUTS:
                return Outcome(skipped=True)
            self._plays += 1
            key = f"audit:{self._plays}"
            try:
                # A guard beyond the calls' own timeouts: no play outlives them all.
                async with asyncio.timeout(self.timeout * (len(calls) + 3)):
                    return await self._play(row, answer, calls, key, last)
            except _Crash as crash:
                if crash.refused:
                    return Outcome(refused=crash.what)
                if crash.hung:
                    self.timeouts += 1
                return Outcome(crash=crash.what)
            except TimeoutError:
                self.timeouts += 1
                return Outcome(crash=f"the play took over {self.timeout * (len(calls) + 3):g} s")

    async def _play(
        self, row: dict[str, Any], answer: str, calls: Sequence[ToolCall], key: str, last: Play
    ) -> Outcome:
        session: dict[str, str] = {}
        if not self.seedless:
            try:
                await self._post("/reset" if self.gym else "/seed_session", row, session, key)
            except _Crash as crash:
                if self.gym or not crash.what.startswith(("404 ", "405 ")):
                    raise
                self.seedless = True
        items: list[dict[str, Any]] = []
        outputs: list[Any] = []
        for n, call in enumerate(calls):
            try:
                result, _ = await self._post(f"/{call.name}", call.arguments, session, key)
            except _Crash as crash:
                if not crash.refused:
                    raise
                result = {"error": crash.what}  # a tool's refusal is its output, as an agent's
            outputs.append(result)
            items += _call_items(call, result, f"{key}:{n}")
        params = row.get("responses_create_params") or {}
        response = build_response(params if isinstance(params, dict) else {}, {"say": answer})
        response["output"] = items + response["output"]
        last.endpoint = "/step" if self.gym else "/verify"
        last.body = {**row, "response": response}
        body, _ = await self._post(last.endpoint, last.body, session, key)
        reward = body.get("reward") if isinstance(body, dict) else None
        if not isinstance(reward, (int, float)) or not _is_reward(reward):
            raise _Crash(f"{last.endpoint} answered no finite reward: {_short(body)}")
        return Outcome(reward=float(reward), outputs=tuple(outputs))

    async def _post(
        self, endpoint: str, payload: Any, session: dict[str, str], key: str
    ) -> tuple[Any, dict[str, str]]:
        headers = {HEADER_ROLLOUT: key}
        if session.get(SESSION_HEADER):
            headers[SESSION_HEADER] = session[SESSION_HEADER]
        cookies = {k: v for k, v in session.items() if k != SESSION_HEADER}
        if cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        try:
            body, set_cookies = await self.http.call_with_cookies(
                self.target, endpoint, _encode(payload), headers=headers, deadline=self.timeout
            )
        except HTTPStatusError as err:
            status = err.status or 0
            text = f"{status} on {endpoint}: {err.message[:200]}"
            raise _Crash(text, refused=400 <= status < 500 and status not in (408, 429)) from None
        except (ReadTimeout, DeadlineExceeded) as err:
            raise _Crash(f"timeout on {endpoint}: {err.message[:200]}", hung=True) from None
        except RollgymError as err:  # reset, refused connection, garbage, an answer too large
            raise _Crash(f"{type(err).__name__} on {endpoint}: {err.message[:200]}") from None
        session.update(set_cookies)
        sid = body.get("session_id") if isinstance(body, dict) else None
        if isinstance(sid, str) and sid and endpoint in ("/seed_session", "/reset"):
            session[SESSION_HEADER] = sid
        return body, set_cookies


def _encode(payload: Any) -> bytes:
    """JSON of ``payload``; text that UTF-8 cannot hold (a lone surrogate) as ``\\uXXXX``
    escapes, as a hostile model's output would arrive."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload, ensure_ascii=True).encode()


def _is_reward(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _call_items(call: ToolCall, result: Any, call_id: str) -> list[dict[str, Any]]:
    """The ``function_call`` and ``function_call_output`` items an agent records for a call."""
    output = result if isinstance(result, str) else _encode(result).decode()
    return [
        {
            "type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
            "name": call.name, "arguments": _encode(call.arguments).decode(),
            "status": "completed",
        },
        {
            "type": "function_call_output", "id": f"fco_{call_id}", "call_id": call_id,
            "output": output, "status": "completed",
        },
    ]  # fmt: skip


def _short(value: Any) -> str:
    try:
        return _encode(value).decode()[:200]
    except (TypeError, ValueError):
        return repr(value)[:200]


AuditDialect = Callable[[str, str, float, int], AbstractAsyncContextManager["Player | None"]]
"""``(name, url, timeout, concurrency)`` -> a context that yields a ``Player`` for the server
at ``url`` when it speaks the dialect's protocol, else None (``rollgym.dialects``)."""
