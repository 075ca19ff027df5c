"""One rollout's OpenEnv session: one WebSocket on ``/ws``, ``reset`` once, then ``step``.

The protocol is openenv-core 0.3.0's (``EnvClient`` and ``HTTPEnvServer``): each message is
``{"type": "reset" | "step" | "state" | "close", "data": {...}}``; a reset or a step is answered
``{"type": "observation", "data": {"observation": {...}, "reward": float | null, "done":
bool}}``, a failure ``{"type": "error", "data": {"message", "code"}}``. The server makes one
environment per socket and destroys it when the socket closes, so a session is never shared:
each rollout opens its own and closes it.

Every wait has a deadline: the connect (``retry.connect_timeout``), each answer (the server's
policy's ``attempt_timeout`` for ``/reset`` or ``/step``, settable per endpoint), and opening the
session as a whole (``retry.deadline``). What is retried, and when it is not safe:

- **Opening** (connect + ``reset``) is retried under the server's policy: a refused connect, a
  dropped socket or a timeout before the reset's answer, a full server (``CapacityReached``),
  each on a new socket, so a new environment (the old one is destroyed with its socket).
- **A step is never replayed**: once it is sent it may have been applied, and the server
  destroys the episode with the socket. A dropped socket or a timeout during a step fails the
  rollout (``ConnectionLost`` / ``ReadTimeout``, retryable: the *whole* rollout may run again).
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from rollgym.errors import ConnectError, DeadlineExceeded, ProtocolError, RollgymError
from rollgym.http import Target
from rollgym.http.classify import classify
from rollgym.openenv import translate
from rollgym.server.agent import count_attempt
from rollgym.wire import (
    OPENENV_CLOSE,
    OPENENV_ERROR,
    OPENENV_OBSERVATION,
    OPENENV_RESET,
    OPENENV_STEP,
    OPENENV_VALIDATION_ERROR,
    OPENENV_WS_PATH,
)

_ABORT_S = 0.2
"""Seconds a closing socket waits for the server's close frame before it is dropped."""

RESET_ENDPOINT = "/reset"
STEP_ENDPOINT = "/step"
"""The names under which the server's ``retry.endpoints`` set a reset's or a step's timeout."""


@dataclass(frozen=True, slots=True)
class Observation:
    """A reset's or a step's answer."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """A step the environment refused as invalid (``VALIDATION_ERROR``): not applied; the
    model is told why."""

    message: str


def ws_url(base: str) -> str:
    """The ``/ws`` URL of a server at ``base`` (``http``/``https`` -> ``ws``/``wss``)."""
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base.rstrip("/") + OPENENV_WS_PATH


class OpenEnvSession:
    """A session of rollout ``rollout`` on the OpenEnv server ``target``, over ``http`` (an
    aiohttp session). With several replicas (each its own OpenEnv server, its own
    ``max_concurrent_envs``), the rollout's id picks the first one to try and each new socket
    tries the next: a full or unreachable replica sends the session to another."""

    def __init__(self, http: aiohttp.ClientSession, target: Target, rollout: str = "") -> None:
        self.http, self.target = http, target
        self._first = zlib.crc32(rollout.encode()) % len(target.urls)
        self.url = ws_url(target.urls[self._first])
        self.attempts = 0
        """Sockets opened so far (more than one: it reconnected before its first step)."""
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    @property
    def server(self) -> str:
        return self.target.name

    async def open(self, reset: dict[str, Any]) -> Observation:
        """Connect and reset with ``reset`` (the reset's keyword arguments), reconnecting under
        the server's retry policy; the first observation."""
        policy = self.target.policy
        _, max_attempts, _ = policy.for_endpoint(RESET_ENDPOINT)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            self.url = ws_url(self.target.urls[(self._first + attempt - 1) % len(self.target.urls)])
            sent = time.monotonic()
            left = policy.deadline - (sent - started)
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    try:
                        await self._connect()
                        answer = await self._exchange(OPENENV_RESET, reset, RESET_ENDPOINT)
                    finally:
                        # Each socket is one attempt of the hop timing it (the rollout's
                        # ``rollgym_timing``: its retries and its wait between them).
                        count_attempt(time.monotonic() - sent)
                if isinstance(answer, Refused):
                    raise ProtocolError(
                        f"{self.server} refused the reset: {answer.message}",
                        server=self.server, endpoint=RESET_ENDPOINT, url=self.url,
                    )  # fmt: skip
                self.attempts = attempt
                return answer
            except TimeoutError as exc:
                await self.close(polite=False)
                raise DeadlineExceeded(
                    f"{self.server}: no session within retry.deadline {policy.deadline:g}s",
                    server=self.server, endpoint=RESET_ENDPOINT, url=self.url,
                    attempts=attempt, retryable=True,
                ) from exc  # fmt: skip
            except RollgymError as err:
                await self.close(polite=False)
                # Each attempt is a new socket, so a new environment: replaying is safe.
                decision = classify(
                    err, policy, idempotent=True, max_attempts=max_attempts, attempt=attempt,
                    time_left=policy.deadline - (time.monotonic() - started),
                    deadline=policy.deadline,
                )  # fmt: skip
                if not decision.retry:
                    self.attempts = attempt
                    raise decision.error from None
                await asyncio.sleep(decision.delay)

    async def step(self, action: dict[str, Any]) -> Observation | Refused:
        """Send one action; its observation, or ``Refused`` for an invalid one. Sent once."""
        if self._ws is None:
            raise ProtocolError("step before the session was opened", server=self.server)
        try:
            return await self._exchange(OPENENV_STEP, action, STEP_ENDPOINT)
        except RollgymError as err:
            await self.close(polite=False)
            if err.type in ("connection_lost", "read_timeout"):
                raise err.with_fields(
                    message=f"{err.message}; {translate.AFTER_STEP}", retryable=True
                ) from None
            raise

    async def close(self, *, polite: bool = True) -> None:
        """End the session: the server then destroys the environment. ``polite``: say
        ``close`` and wait (``retry.connect_timeout``) for the server to close first; else (a
        failed session: the server may be stuck in a step) drop the socket at once. Safe to
        call twice."""
        ws, self._ws = self._ws, None
        if ws is None or ws.closed:
            return
        try:
            if polite:
                async with asyncio.timeout(self.target.policy.connect_timeout):
                    await ws.send_str(orjson.dumps({"type": OPENENV_CLOSE}).decode())
                    # The server closes first once it has destroyed the environment; closing
                    # before that makes openenv-core's handler log a disconnect as a crash.
                    await ws.receive()
            # A close that is not answered at once is cut short: aiohttp then drops the
            # connection (a cancelled close aborts it).
            async with asyncio.timeout(_ABORT_S):
                await ws.close()
        except (TimeoutError, aiohttp.ClientError, ConnectionError, RuntimeError):
            pass  # the session is over either way: the socket goes with this object

    async def _connect(self) -> None:
        await self.close()
        policy = self.target.policy
        try:
            # The TCP connect and the upgrade together within connect_timeout; each answer
            # then has its own deadline (``_exchange``), so the socket's receive has none.
            async with asyncio.timeout(policy.connect_timeout):
                self._ws = await self.http.ws_connect(
                    self.url,
                    timeout=aiohttp.ClientWSTimeout(
                        ws_receive=None, ws_close=policy.connect_timeout
                    ),
                    max_msg_size=policy.answer_limits.body_bytes,
                )
        except TimeoutError as exc:  # nothing was sent: as a refused connect
            raise ConnectError(
                f"timed out connecting to {self.server} at {self.url} "
                f"(retry.connect_timeout {policy.connect_timeout:g}s)",
                server=self.server, url=self.url, endpoint=OPENENV_WS_PATH, method="WS",
            ) from exc  # fmt: skip
        except Exception as exc:  # translated; a bug of ours is re-raised there
            raise translate.transport_error(
                exc, server=self.server, url=self.url, endpoint=OPENENV_WS_PATH,
                timeout=policy.connect_timeout,
            ) from exc  # fmt: skip

    async def _exchange(
        self, kind: str, data: dict[str, Any], endpoint: str
    ) -> Observation | Refused:
        """Send one message and read its answer within the endpoint's ``attempt_timeout``."""
        ws = self._ws
        assert ws is not None
        _, _, timeout = self.target.policy.for_endpoint(endpoint)
        where: dict[str, Any] = {"server": self.server, "url": self.url, "endpoint": endpoint}
        try:
            await ws.send_str(_encode({"type": kind, "data": data}))
        except Exception as exc:
            # A server that refuses the session (full) says why first, then closes: that
            # answer may be waiting although the send failed.
            sent: BaseException | None = exc
        else:
            sent = None
        try:
            # A deadline on the whole wait: receive's own timeout starts again after each ping
            # it answers, so a server that pings and never answers would hold it for ever.
            async with asyncio.timeout(timeout):
                message = await ws.receive()
        except Exception as exc:
            raise translate.transport_error(sent or exc, timeout=timeout, **where) from exc
        if sent is not None and message.type != aiohttp.WSMsgType.TEXT:
            raise translate.transport_error(sent, timeout=timeout, **where) from sent
        if message.type == aiohttp.WSMsgType.ERROR and _oversize(message.data):
            raise translate.too_large(
                self.server, self.url, endpoint, self.target.policy.answer_limits.body_bytes
            )
        if message.type != aiohttp.WSMsgType.TEXT:
            raise translate.closed(self.server, self.url, endpoint, ws.close_code)
        return _answer(message.data, **where)


def _encode(message: dict[str, Any]) -> str:
    """``message`` as JSON text; text UTF-8 cannot hold (a model's lone surrogate) as
    ``\\uXXXX`` escapes, as any JSON sender writes it, rather than a ``TypeError`` here."""
    try:
        return orjson.dumps(message).decode()
    except TypeError:
        return json.dumps(message, ensure_ascii=True)


def _oversize(data: Any) -> bool:
    return (
        isinstance(data, aiohttp.WebSocketError)
        and data.code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    )


def _answer(raw: str, *, server: str, url: str, endpoint: str) -> Observation | Refused:
    """A text answer as an ``Observation``, a ``Refused`` step, or the error it reports."""
    where: dict[str, Any] = {"server": server, "url": url, "endpoint": endpoint}
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtocolError(
            f"{server} sent a message that is not JSON", body=raw, **where
        ) from None
    kind = answer.get("type") if isinstance(answer, dict) else None
    data = answer.get("data") if isinstance(answer, dict) else None
    if kind == OPENENV_ERROR:
        if isinstance(data, dict) and data.get("code") == OPENENV_VALIDATION_ERROR:
            return Refused(_validation_text(data))
        raise translate.answer_error(data, **where)
    if kind != OPENENV_OBSERVATION or not isinstance(data, dict):
        raise ProtocolError(
            f"{server} answered {endpoint} with a {kind!r} message, not an observation",
            body=raw, **where,
        )  # fmt: skip
    observation, reward, done = data.get("observation"), data.get("reward"), data.get("done")
    if not isinstance(observation, dict):
        raise ProtocolError(f"{server}: observation is not an object", body=raw, **where)
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward
        or reward in (float("inf"), float("-inf"))
    ):  # fmt: skip
        raise ProtocolError(
            f"{server}: reward {reward!r} is not a finite number", body=raw, **where
        )
    if not isinstance(done, bool):
        raise ProtocolError(f"{server}: done {done!r} is not true/false", body=raw, **where)
    return Observation(observation, None if reward is None else float(reward), done)


def _validation_text(data: dict[str, Any]) -> str:
    errors = data.get("errors")
    if isinstance(errors, list) and errors:
        parts = []
        for e in errors[:5]:
            if isinstance(e, dict):
                loc = ".".join(str(p) for p in e.get("loc") or ())
                parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
        return "invalid action: " + "; ".join(parts)
    return f"invalid action: {data.get('message') or 'refused'}"
