"""JSON endpoints: bounded body reading, orjson, error bodies, cancellation on disconnect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rollgym.errors import (
    ConfigError,
    DeadlineExceeded,
    HTTPStatusError,
    InvalidRequest,
    ReadTimeout,
    RequestTooLarge,
    RollgymError,
    StaleRollout,
    TransportError,
    chain_text,
)
from rollgym.wire import HEADER_ROLLOUT, SCOPE_ROLLOUT

MAX_BODY_BYTES = 32 * 1024 * 1024  # a request body past this is refused with 413
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads this answer

Endpoint = Callable[[Request], Awaitable[Response]]

SCOPE_TOKEN_CAPTURE = "rollgym.token_capture"
"""The ASGI scope key set when the path asked for training token ids (``training-token-capture``)."""


class JSONResponse(Response):
    """A JSON response encoded with orjson (several times faster than the stdlib)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError as exc:
            # orjson reads 1,024 levels but writes 255: a request it accepted (a row echoed
            # by /verify) must not become a 500 on the way out. Anything else stays an error.
            if "recursion" not in str(exc).lower():
                raise
            return json.dumps(content, ensure_ascii=False, allow_nan=False).encode()


@dataclass(frozen=True)
class Call:
    """What a handler sees of a request besides its JSON body."""

    request: Request
    size: int = 0
    """The bytes of the request's body."""

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    @property
    def cookies(self) -> Mapping[str, str]:
        return self.request.cookies  # parsed on first use only

    @property
    def rollout(self) -> str | None:
        """The caller's rollout id, if it sent one: its ``x-rollgym-rollout`` header, else the
        ``<id>`` of the ``/ng-rollout/<id>/`` path it called."""
        return self.request.headers.get(HEADER_ROLLOUT) or self.request.scope.get(SCOPE_ROLLOUT)

    @property
    def token_capture(self) -> bool:
        """Whether the call asked for training token ids (the
        ``/ng-rollout/<id>/training-token-capture/...`` path, on model and agent servers)."""
        return SCOPE_TOKEN_CAPTURE in self.request.scope


Handler = Callable[[Any, Call], Awaitable[Any]]


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes of a request body an endpoint reads, and the option that raises it."""

    max_bytes: int = MAX_BODY_BYTES
    option: str | None = None
    """Where to raise it (``servers.NAME.limits.seed_bytes``); None: rollgym's fixed limit."""

    def refused(self, size: str) -> RequestTooLarge:
        how = (
            f"{self.option} = {self.max_bytes}; if such requests are expected, raise it in "
            "the config"
            if self.option
            else "the fixed limit of a rollgym endpoint"
        )
        return RequestTooLarge(
            f"request body of {size} bytes is past {self.max_bytes} ({how})", status=413
        )


ANY_BODY = BodyLimit()


def json_endpoint(handler: Handler, limit: BodyLimit = ANY_BODY) -> Endpoint:
    """An endpoint calling ``handler(body, call)`` with the request's JSON body (at most
    ``limit``): its answer (plain data, or a ``Response`` as it is) is sent as JSON. The
    handler is cancelled if the caller disconnects first, with the requests it has in flight."""

    async def endpoint(request: Request) -> Response:
        raw = await read_body(request, limit)
        body = parse_json(raw)
        result = await until_disconnect(request, handler(body, Call(request, len(raw))))
        return result if isinstance(result, Response) else JSONResponse(result)

    return endpoint


def check_size(request: Request, limit: BodyLimit = ANY_BODY) -> None:
    """Refuse a declared body past ``limit`` before reading it."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit.max_bytes:
        raise limit.refused(size)


async def read_body(request: Request, limit: BodyLimit = ANY_BODY) -> bytes:
    """The request body, refused with 413 past ``limit`` while it is still arriving (a chunked
    body declares no length, and must not be read whole first). It can be read once: pass the
    bytes on rather than reading again."""
    check_size(request, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit.max_bytes:
            raise limit.refused(f"{size} or more")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request) -> Any:
    """The request body as JSON (``None`` if empty); a malformed or oversized body is an
    ``InvalidRequest`` (4xx)."""
    return parse_json(await read_body(request))


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON (``None`` if empty); malformed: ``InvalidRequest`` (400)."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", status=400) from None


def error_response(
    server: str, err: RollgymError, beside: dict[str, Any] | None = None
) -> JSONResponse:
    """The uniform error body for ``err`` raised while serving a request on ``server``;
    ``beside``: fields the body carries beside ``error`` (an agent's ``rollgym_cost``)."""
    if isinstance(err, InvalidRequest):
        status, payload = err.status or 400, err.to_dict()
        payload.update(status=status, server=server)
    elif isinstance(err, StaleRollout) and err.server in (None, server):
        # The caller's rollout is too old for the live weights: a conflict, not a failure here.
        status, payload = 409, err.to_dict()
        payload.update(status=status, server=server)
    elif isinstance(err, ConfigError):
        status, payload = 400, err.to_dict()
        payload.update(status=status, server=server)
    elif err.server is not None and err.server != server:
        # Failed while calling another server: this server is a gateway for that failure.
        status = 504 if isinstance(err, (ReadTimeout, DeadlineExceeded)) else 502
        payload = {
            "type": "upstream_error",
            "message": f"{err.server} failed: {chain_text(err)}",
            "status": status,
            "server": server,
            "retryable": False,
            "origin": err.to_dict(),
        }
    else:
        status = err.status if isinstance(err, HTTPStatusError) and err.status else 500
        if isinstance(err, TransportError):
            status = 504
        payload = err.to_dict()
        payload.update(status=status, server=server)
    return JSONResponse({"error": payload, **(beside or {})}, status_code=status)


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await ``work``, but cancel it (and the requests it has in flight) if the client goes
    away: abandoned work must not keep a broken upstream under load. The body must have been
    read already. ``work`` runs in the current task; one watcher task per request cancels it.
    """
    task = asyncio.current_task()
    assert task is not None
    gone = asyncio.Event()
    watcher = asyncio.create_task(_cancel_on_disconnect(request, task, gone))
    try:
        return await work
    except asyncio.CancelledError:
        if not gone.is_set():
            raise  # cancelled from outside (shutdown): not ours to swallow
        task.uncancel()
        return Response(status_code=CLIENT_GONE)
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(
    request: Request, task: asyncio.Task[Any], gone: asyncio.Event
) -> None:
    await _wait_disconnect(request)
    gone.set()
    task.cancel()


async def _wait_disconnect(request: Request) -> None:
    # After the body is read, the next ASGI message is http.disconnect, sent when the client
    # closes the connection (or after our response is sent, by which time we no longer wait).
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return
