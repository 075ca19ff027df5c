"""The one place where an OpenEnv server's failures become rollgym errors.

Two sources: the WebSocket transport (aiohttp's exceptions and close frames, which must not
escape: they hold objects that do not pickle), and the server's own ``{"type": "error", "data":
{"message", "code"}}`` answers. A failure inside the foreign environment (its ``reset`` or
``step`` raised: ``EXECUTION_ERROR``) is that server's failure: an ``HTTPStatusError`` 500
naming it, never a reward. A full server (``CAPACITY_REACHED``) is ``CapacityReached`` (503,
retried per the server's policy). An invalid action (``VALIDATION_ERROR``) is the model's
mistake, not a failure: the session answers it to the model (``OpenEnvSession.step``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from rollgym.errors import (
    AnswerTooLarge,
    CapacityReached,
    ConnectError,
    ConnectionLost,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
    RollgymError,
)
from rollgym.wire import (
    OPENENV_CAPACITY_REACHED,
    OPENENV_EXECUTION_ERROR,
    OPENENV_FACTORY_ERROR,
    OPENENV_SESSION_ERROR,
)

AFTER_STEP = (
    "a step may have been applied, and the server ends a session whose socket drops: the "
    "episode is lost, not resumed (the whole rollout may run again on a new session)"
)


def transport_error(
    exc: BaseException, *, server: str, url: str, endpoint: str, timeout: float
) -> RollgymError:
    """``exc`` from connecting, sending or receiving on ``url`` as a rollgym error."""
    where: dict[str, Any] = {"server": server, "url": url, "endpoint": endpoint, "method": "WS"}
    if isinstance(exc, RollgymError):
        return exc
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        # The server answered the upgrade with a status: no /ws there (a production-mode or
        # non-OpenEnv server), or a proxy's 5xx.
        return HTTPStatusError(
            f"{server} refused the WebSocket upgrade: {exc.status} {exc.message}",
            status=exc.status, **where,
        )  # fmt: skip
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectError(f"cannot connect to {server} at {url}: {exc.strerror or exc}", **where)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return ReadTimeout(f"{server} did not answer {endpoint} within {timeout:g}s", **where)
    if isinstance(exc, (aiohttp.ClientError, ConnectionError, OSError)):
        return ConnectionLost(
            f"{server}: the WebSocket broke: {type(exc).__name__}: {exc}", **where
        )
    raise exc  # a bug of ours: not a server's failure


def closed(server: str, url: str, endpoint: str, code: int | None) -> ConnectionLost:
    """The server closed the socket (or it dropped) before answering."""
    return ConnectionLost(
        f"{server} closed the WebSocket (code {code}) before answering {endpoint}",
        server=server, url=url, endpoint=endpoint, method="WS",
    )  # fmt: skip


def too_large(server: str, url: str, endpoint: str, limit: int) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"{server} sent a WebSocket message over {limit} bytes (retry.answer_limits.body_bytes)",
        server=server, url=url, endpoint=endpoint, method="WS", retryable=False,
    )  # fmt: skip


def answer_error(data: Any, *, server: str, url: str, endpoint: str) -> RollgymError:
    """An ``{"type": "error"}`` answer's ``data`` as the error of ``server``."""
    body = orjson.dumps(data)
    where: dict[str, Any] = {"server": server, "url": url, "endpoint": endpoint, "method": "WS"}
    info = data if isinstance(data, dict) else {}
    code, message = info.get("code"), str(info.get("message") or "no message")
    if code == OPENENV_CAPACITY_REACHED:
        return CapacityReached(
            f"{server} is full ({info.get('active_sessions')} of {info.get('max_sessions')} "
            f"sessions, its max_concurrent_envs): {message}",
            status=503, body=body, **where,
        )  # fmt: skip
    if code in (OPENENV_EXECUTION_ERROR, OPENENV_FACTORY_ERROR, OPENENV_SESSION_ERROR):
        return HTTPStatusError(
            f"{server}: the environment failed ({code}): {message}", status=500, body=body, **where
        )
    return ProtocolError(
        f"{server} answered {endpoint} with error {code}: {message}", body=body, **where
    )
