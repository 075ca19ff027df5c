"""The ASGI app of every rollgym server: health, stats, uniform error bodies, fast JSON.

Every error leaves a rollgym server as ``{"error": {"type", "message", "status", "server",
"retryable", "origin"?}}``. A failure that came from another server is answered 502 (504 for a
timeout) with that server's error as ``origin``, so the caller can tell who failed and how.

The app is plain Starlette (routes, exception handlers, lifespan) behind one small front: a POST
to an exact path, which is every hop of a rollout, goes straight to its endpoint by a dict
lookup, its errors answered by the same handler Starlette uses. Starlette's middleware stack and
linear route scan would cost about as much as the endpoint itself, several times per rollout.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from rollgym.errors import HTTPStatusError, InternalError, InvalidRequest, RollgymError
from rollgym.server.endpoint import MAX_BODY_BYTES, Endpoint, JSONResponse, error_response

if TYPE_CHECKING:
    from rollgym.server.base import BaseServer

log = logging.getLogger("rollgym.server")


class App:
    """A rollgym server's ASGI app: exact-path POST routes by dict lookup, the rest (GET routes,
    unknown paths and methods, lifespan) through Starlette with the same error handling."""

    def __init__(self, server: BaseServer, routes: Sequence[BaseRoute]) -> None:
        self.server = server
        self.posts: dict[str, Endpoint] = {
            r.path: r.endpoint
            for r in routes
            if isinstance(r, Route) and r.methods and "POST" in r.methods and "{" not in r.path
        }
        self.starlette = Starlette(
            routes=list(routes),
            exception_handlers={
                HTTPException: self._on_error,
                RollgymError: self._on_error,
                Exception: self._on_error,
            },
            lifespan=self._lifespan,
        )
        # A path with a trailing slash too many (``POST /verify/``) is a 404 with the error
        # body, not a 307 to a URL built from the request's Host header: every caller of a
        # rollgym server knows its exact paths, and a redirect would send the body elsewhere.
        self.starlette.router.redirect_slashes = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.posts.get(scope["path"])
            if endpoint is not None:
                request = Request(scope, receive)
                try:
                    response = await endpoint(request)
                except Exception as exc:  # every error becomes the uniform body
                    response = await self._on_error(request, exc)
                await response(scope, receive, send)
                return
        await self.starlette(scope, receive, send)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.server.startup()
        try:
            yield
        finally:
            await self.server.shutdown()

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        return error_response(self.server.name, as_rollgym_error(request, exc, self.server.name))


def as_rollgym_error(request: Request, exc: Exception, server: str) -> RollgymError:
    """``exc`` raised while serving ``request`` as the rollgym error to answer with."""
    if isinstance(exc, RollgymError):
        if not isinstance(exc, InvalidRequest):
            log.warning("%s %s failed: %s", request.method, request.url.path, exc)
        return exc
    if isinstance(exc, HTTPException):
        # An unknown route or method: the caller has the wrong URL (a configuration error),
        # unlike a malformed request to a real endpoint (invalid_request).
        return HTTPStatusError(
            f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code
        )
    log.error("%s %s crashed", request.method, request.url.path, exc_info=exc)
    return InternalError(f"{type(exc).__name__}: {exc}", server=server)


def build_app(server: BaseServer) -> App:
    """The ASGI app of ``server``: health, stats, error handlers and its own routes."""

    async def health(request: Request) -> Response:
        answer = server.health()  # a server that knows itself broken says so with a 503
        return JSONResponse(answer, status_code=200 if answer.get("status") == "ok" else 503)

    async def stats(request: Request) -> Response:
        # What this server's calls to others went through: retries, budget, breaker state.
        out: dict[str, Any] = {}
        for name, st in server.client.stats().items():
            breakers = server.client.breakers(name)
            out[name] = {**vars(st), "breaker": breakers[0].state if breakers else None}
            if len(breakers) > 1:  # a breaker per replica: the first alone would hide the rest
                out[name]["breakers"] = [b.state for b in breakers]
        return JSONResponse({"server": server.name, "calls": out})

    routes: list[BaseRoute] = [
        Route("/health", health, methods=["GET", "POST"]),
        Route("/stats", stats, methods=["GET", "POST"]),
        *server.routes(),
    ]
    return App(server, routes)


__all__ = ["MAX_BODY_BYTES", "App", "JSONResponse", "build_app", "error_response"]
