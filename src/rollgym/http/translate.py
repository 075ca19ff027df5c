"""The one place where the transports' exceptions become rollgym errors.

Those of the lean transport (``rollgym.http.lean``: sockets, httptools, timeouts, raised as the
exceptions of ``rollgym.http.transport``) and of aiohttp, which sends what the lean one does
not. aiohttp's own errors hold
``CIMultiDictProxy`` headers and request objects that do not pickle; nothing from either may
escape past this module. Every branch raises ``from`` the original.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, NoReturn

import orjson
from httptools import HttpParserError, HttpParserUpgrade

from rollgym.errors import (
    AnswerTooLarge,
    ConnectError,
    ConnectionLost,
    ProtocolError,
    ReadTimeout,
    RollgymError,
    TransportError,
)
from rollgym.http.limits import OverLimit, Undecodable
from rollgym.http.transport import AnswerCut, ConnectFailed, ConnectTimeout, IdleTimeout, Request


def translate(
    exc: BaseException,
    *,
    server: str,
    method: str,
    url: str,
    endpoint: str,
    timeout: float,
    idle_timeout: float | None = None,
) -> RollgymError:
    """Map an exception from one attempt (either transport) to the matching rollgym error."""
    where: dict[str, Any] = {"server": server, "method": method, "url": url, "endpoint": endpoint}
    if isinstance(exc, RollgymError):
        return exc
    if isinstance(exc, OverLimit):
        return answer_too_large(exc, server, where)
    if isinstance(exc, Undecodable):
        return ProtocolError(f"{server} sent a body that does not decode: {exc}", **where)
    if isinstance(exc, ConnectFailed):
        return ConnectError(
            f"cannot connect to {server} at {exc.host}:{exc.port}: {exc.strerror or exc}",
            **where,
        )
    if isinstance(exc, ConnectTimeout):
        return ConnectError(f"timed out connecting to {server}", **where)
    if isinstance(exc, IdleTimeout) and idle_timeout is not None:
        return ReadTimeout(f"{server} sent nothing for {idle_timeout:g}s", **where)
    if isinstance(exc, AnswerCut):
        return ConnectionLost(f"{server} closed the connection: {exc.strerror}", **where)
    if isinstance(exc, HttpParserError):
        return ProtocolError(f"{server} sent a response that is not valid HTTP: {exc}", **where)
    if isinstance(exc, HttpParserUpgrade):
        return ProtocolError(
            f"{server} answered 101 Switching Protocols (an upgrade to another protocol) to "
            "a JSON POST: no answer can follow",
            **where,
        )
    # Only a process that imported aiohttp can have its errors to translate; one that never
    # did (every server that calls out over plain HTTP only) must not import it for this.
    if "aiohttp" in sys.modules:
        known = _aiohttp_error(exc, server, idle_timeout, where)
        if known is not None:
            return known
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return ReadTimeout(f"{server} did not answer within {timeout:g}s", **where)
    if isinstance(exc, (orjson.JSONDecodeError, json.JSONDecodeError, UnicodeDecodeError)):
        return ProtocolError(f"{server} sent a body that is not valid JSON: {exc}", **where)
    if isinstance(exc, ValueError):
        # Raised before anything was sent (aiohttp refusing the request as built, e.g. a URL
        # with credentials and an Authorization header): the same request fails every time.
        return TransportError(
            f"cannot send the request to {server}: {exc}", retryable=False, **where
        )
    if isinstance(exc, ConnectionRefusedError):
        return ConnectError(f"cannot connect to {server}: {exc.strerror or exc}", **where)
    if isinstance(exc, OSError):
        # A socket error that aiohttp did not wrap: the request may have been sent.
        return ConnectionLost(f"connection to {server} broke: {exc.strerror or exc}", **where)
    return TransportError(f"{server}: unexpected {type(exc).__name__}: {exc}", **where)


def answer_too_large(exc: OverLimit, server: str, where: dict[str, Any]) -> AnswerTooLarge:
    """``OverLimit`` as the error a caller records: what was past which limit, how to raise it.

    Never retried, and not counted against the server's breaker (it answered): the same
    request gets the same oversized answer (a bomb, a runaway stream, a limit set too low for
    what the server legitimately sends), and reading it again costs the same again."""
    return AnswerTooLarge(
        f"{server}'s answer to POST {where['endpoint']} is past answer_limits.{exc.limit} = "
        f"{exc.allowed} ({exc.seen} or more); nothing more was read. If such answers are "
        f"expected, raise retry.answer_limits.{exc.limit} of server {server!r} in the config "
        "(a proxy's upstream: options.upstream_retry.answer_limits)",
        status=exc.status, retryable=False, **where,
    )  # fmt: skip


def _aiohttp_error(
    exc: BaseException, server: str, idle_timeout: float | None, where: dict[str, Any]
) -> RollgymError | None:
    """The rollgym error for one of aiohttp's exceptions; None for any other exception."""
    import aiohttp  # already imported: the caller checked

    # Order matters: the connector errors are subclasses of ClientOSError.
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectError(
            f"cannot connect to {server} at {exc.host}:{exc.port}: {exc.os_error.strerror or exc}",
            **where,
        )
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectError(f"timed out connecting to {server}", **where)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        if idle_timeout is not None:
            # sock_read: the server went silent mid-answer (or before its headers).
            return ReadTimeout(f"{server} sent nothing for {idle_timeout:g}s", **where)
        return None  # a plain timeout, as any other
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return ConnectionLost(f"{server} closed the connection: {exc}", **where)
    if isinstance(exc, aiohttp.ClientOSError):
        return ConnectionLost(f"connection to {server} broke: {exc.strerror or exc}", **where)
    if isinstance(exc, aiohttp.ClientResponseError):
        # We never call raise_for_status: this comes from the response parser, so the server
        # sent something that is not HTTP (its status, if any, is aiohttp's invention).
        return ProtocolError(
            f"{server} sent a response that is not valid HTTP: {exc.message}", **where
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return ConnectError(f"invalid URL for {server}: {where['url']}", retryable=False, **where)
    if isinstance(exc, aiohttp.ClientError):
        return TransportError(f"{server}: {type(exc).__name__}: {exc}", **where)
    return None


def raise_translated(exc: BaseException, request: Request) -> NoReturn:
    """Raise ``exc``, from one attempt of ``request``, as the matching rollgym error."""
    raise translate(
        exc, server=request.server, method="POST", url=request.url, endpoint=request.endpoint,
        timeout=request.timeout, idle_timeout=request.idle_timeout,
    ) from exc  # fmt: skip
