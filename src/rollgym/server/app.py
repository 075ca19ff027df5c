"""App factory shared by every rollgym server: health, uniform error bodies, fast JSON.

Every error leaves a rollgym server as ``{"error": {"type", "message", "status", "server",
"retryable", "origin"?}}``. A failure that came from another server is answered 502 (504 for a
timeout) with that server's error as ``origin``, so the caller can tell who failed and how.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rollgym.errors import (
    ConfigError,
    DeadlineExceeded,
    HTTPStatusError,
    InternalError,
    InvalidRequest,
    ReadTimeout,
    RollgymError,
    TransportError,
)

if TYPE_CHECKING:
    from rollgym.server.base import BaseServer

log = logging.getLogger("rollgym.server")

MAX_BODY_BYTES = 32 * 1024 * 1024  # a request body past this is refused with 413


class JSONResponse(Response):
    """A JSON response encoded with orjson (several times faster than the stdlib)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def check_size(request: Request) -> None:
    """Refuse a declared body past ``MAX_BODY_BYTES`` before reading it."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise InvalidRequest(f"request body of {size} bytes exceeds {MAX_BODY_BYTES}", status=413)


async def read_body(request: Request) -> bytes:
    """The request body, refused with 413 past ``MAX_BODY_BYTES`` while it is still arriving
    (a chunked body declares no length, and must not be read whole first)."""
    check_size(request)
    cached = getattr(request, "_body", None)
    if isinstance(cached, bytes):
        return cached
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise InvalidRequest(f"request body exceeds {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # Starlette's own cache: later request.body() calls return it
    return body


async def read_json(request: Request) -> Any:
    """The request body as JSON; a malformed or oversized body is an ``InvalidRequest`` (4xx)."""
    raw = await read_body(request)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", status=400) from None


def error_response(server: str, err: RollgymError) -> JSONResponse:
    """The uniform error body for ``err`` raised while serving a request on ``server``."""
    if isinstance(err, InvalidRequest):
        status, payload = err.status or 400, err.to_dict()
        payload.update(status=status, server=server)
    elif isinstance(err, ConfigError):
        status, payload = 400, err.to_dict()
        payload.update(status=status, server=server)
    elif err.server is not None and err.server != server:
        # Failed while calling another server: this server is a gateway for that failure.
        status = 504 if isinstance(err, (ReadTimeout, DeadlineExceeded)) else 502
        payload = {
            "type": "upstream_error",
            "message": f"{err.server} failed: {err.message}",
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
    return JSONResponse({"error": payload}, status_code=status)


# Recent FastAPI versions look up OpenTelemetry providers on every request; rollgym servers
# sit on the hot path of every rollout and do not trace.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class FastRoutes:
    """ASGI front of a rollgym app: exact-path POST routes go straight to their endpoint.

    A rollout makes several hops; FastAPI's middleware stack and linear route scan cost as
    much as the endpoint itself. Errors are still handled by the app's exception handlers;
    everything else (health, lifespan, docs) goes through the FastAPI app unchanged.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._routes: dict[str, ASGIApp] | None = None
        self._handlers: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})

    def _index(self) -> dict[str, ASGIApp]:
        routes = {
            r.path: r.app
            for r in self.app.router.routes
            # Plain Starlette routes only: FastAPI's own routes need its middleware stack.
            if type(r) is Route and r.methods and "POST" in r.methods and "{" not in r.path
        }
        handlers = {k: v for k, v in self.app.exception_handlers.items() if not isinstance(k, int)}
        self._handlers = (handlers, {})
        return routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            if self._routes is None:
                self._routes = self._index()
            route = self._routes.get(scope["path"])
            if route is not None:
                scope["app"] = self.app
                scope["starlette.exception_handlers"] = self._handlers
                await route(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(server: BaseServer) -> FastRoutes:
    """The ASGI app of ``server``: health, stats, error handlers and its own routes."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.startup()
        try:
            yield
        finally:
            await server.shutdown()

    app = FastAPI(title=f"rollgym {server.kind}: {server.name}", lifespan=lifespan, **_NO_TELEMETRY)

    async def on_rollgym_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RollgymError)
        if not isinstance(exc, InvalidRequest):
            log.warning("%s %s failed: %s", request.method, request.url.path, exc)
        return error_response(server.name, exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return error_response(server.name, InvalidRequest(problems, status=422))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s crashed", request.method, request.url.path)
        err = InternalError(f"{type(exc).__name__}: {exc}", server=server.name)
        return error_response(server.name, err)

    async def on_http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # An unknown route or method: the caller has the wrong URL (a configuration error),
        # unlike a malformed request to a real endpoint (invalid_request).
        err = HTTPStatusError(
            f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code
        )
        return error_response(server.name, err)

    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(RollgymError, on_rollgym_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)

    async def health() -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "server": server.name,
                "kind": server.kind,
                "features": server.features(),
            }
        )

    async def stats() -> Response:
        # What this server's calls to others went through: retries, budget, breaker state.
        out = {}
        for name, st in server.client.stats().items():
            breaker = server.client.breaker(name)
            out[name] = {**vars(st), "breaker": breaker.state if breaker else None}
        return JSONResponse({"server": server.name, "calls": out})

    app.add_api_route("/health", health, methods=["GET", "POST"])
    app.add_api_route("/stats", stats, methods=["GET", "POST"])
    server.add_routes(app)
    return FastRoutes(app)


def json_route(
    handler: Callable[[Request], Awaitable[Any]],
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler that returns plain JSON data into a raw Starlette endpoint (no pydantic
    validation on the hot path; handlers validate what they need themselves). The handler is
    cancelled if its caller disconnects first."""

    async def endpoint(request: Request) -> Response:
        await read_body(request)  # read (and cache) the body before watching for a disconnect
        result = await until_disconnect(request, handler(request))
        if isinstance(result, Response):
            return result
        return JSONResponse(result)

    return endpoint


CLIENT_GONE = 499  # nginx's "client closed request": nobody reads this answer


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
