"""The ASGI app of every rollgym server: health, stats, uniform error bodies, fast JSON.

Every error leaves a rollgym server as ``{"error": {"type", "message", "status", "server",
"retryable", "origin"?}}``. A failure that came from another server is answered 502 (504 for a
timeout) with that server's error as ``origin``, so the caller can tell who failed and how.

The app is plain Starlette (routes, exception handlers, lifespan) behind one small front: a POST
to an exact path, which is every hop of a rollout, goes straight to its endpoint by a dict
lookup, its errors answered by the same handler Starlette uses. Starlette's middleware stack and
linear route scan would cost about as much as the endpoint itself, several times per rollout.

NeMo Gym 0.7 calls servers at ``/ng-rollout/<id>/<rest>`` to name the rollout (and model and
agent servers at ``/ng-rollout/<id>/training-token-capture/<rest>`` to ask for training token
ids): every rollgym server serves such a path as ``/<rest>``, with ``<id>`` as the call's rollout
id when it sends no ``x-rollgym-rollout`` header (``Call.rollout``, ``Call.token_capture``).
An invalid ``<id>`` (not ``wire.ROLLOUT_ID_PATTERN``, or over ``MAX_ROLLOUT_ID_CHARS``) is
answered 404 (the path names no endpoint). Other paths pay one ``str.startswith`` for this.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from rollgym import tracing
from rollgym.errors import HTTPStatusError, InternalError, InvalidRequest, RollgymError
from rollgym.prometheus.exposition import Exposition, metrics_endpoint
from rollgym.server.endpoint import (
    MAX_BODY_BYTES,
    SCOPE_TOKEN_CAPTURE,
    Endpoint,
    JSONResponse,
    error_response,
)
from rollgym.wire import (
    METRICS_ENDPOINT,
    ROLLOUT_ID_PATTERN,
    ROLLOUT_PREFIX,
    SCOPE_ROLLOUT,
    TOKEN_CAPTURE_SEGMENT,
)

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from rollgym.server.base import BaseServer

log = logging.getLogger("rollgym.server")

MAX_ROLLOUT_ID_CHARS = 256
"""The longest ``<id>`` of ``/ng-rollout/<id>/`` taken (the protocol sets no bound; ids are
``<task>-<rollout>[-a<attempt>]`` or a caller's own short id)."""
TOKEN_CAPTURE_KINDS = frozenset({"model", "agent"})
"""The server kinds that take ``/ng-rollout/<id>/training-token-capture/``."""

_PREFIX = f"/{ROLLOUT_PREFIX}/"
_CAPTURE = f"/{TOKEN_CAPTURE_SEGMENT}"
_ROLLOUT_ID = re.compile(ROLLOUT_ID_PATTERN)


class App:
    """A rollgym server's ASGI app: exact-path POST routes by dict lookup, the rest (GET routes,
    unknown paths and methods, lifespan) through Starlette with the same error handling."""

    def __init__(self, server: BaseServer, routes: Sequence[BaseRoute]) -> None:
        self.server = server
        self.token_capture = server.kind in TOKEN_CAPTURE_KINDS
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
        if scope["type"] == "http" and scope["path"].startswith(_PREFIX):
            inner = unprefixed(scope, token_capture=self.token_capture)
            if isinstance(inner, RollgymError):
                await error_response(self.server.name, inner)(scope, receive, send)
                return
            scope = inner
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.posts.get(scope["path"])
            if endpoint is not None:
                request = Request(scope, receive)
                # Traced (rollgym.tracing): the caller's trace goes on in this server's span.
                span = (
                    None if tracing.active is None else tracing.active.serving(self.server, request)
                )
                try:
                    response = await endpoint(request)
                except Exception as exc:  # every error becomes the uniform body
                    response = await self._on_error(request, exc)
                except BaseException:
                    if span is not None:
                        span.cancelled()
                    raise
                if span is not None:
                    span.answered(response)
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
            tracing.flush()  # the last spans, before uvicorn ends the process (rollgym.tracing)

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        return error_response(self.server.name, as_rollgym_error(request, exc, self.server.name))


def unprefixed(scope: Scope, *, token_capture: bool) -> Scope | HTTPStatusError:
    """The scope of ``/ng-rollout/<id>/[training-token-capture/]<rest>`` served as ``/<rest>``,
    naming rollout ``<id>`` (the segment is taken only with ``token_capture``); the 404 to
    answer when ``<id>`` is no rollout id. Only the first prefix is taken: a second one is part
    of ``<rest>``, which then names no endpoint."""
    path: str = scope["path"]
    end = path.find("/", len(_PREFIX))
    rollout = path[len(_PREFIX) : end]
    if end < 0 or len(rollout) > MAX_ROLLOUT_ID_CHARS or not _ROLLOUT_ID.fullmatch(rollout):
        shown = path if len(path) <= 120 else f"{path[:100]}... ({len(path)} characters)"
        return HTTPStatusError(
            f"{scope['method']} {shown}: not found: the <id> of /{ROLLOUT_PREFIX}/<id>/ must "
            f"match {ROLLOUT_ID_PATTERN} and have at most {MAX_ROLLOUT_ID_CHARS} characters",
            status=404,
        )
    rest = path[end:]
    inner = {**scope, SCOPE_ROLLOUT: rollout}
    if (
        token_capture
        and rest.startswith(_CAPTURE)
        and rest[len(_CAPTURE) : len(_CAPTURE) + 1] == "/"
    ):
        rest = rest[len(_CAPTURE) :]
        inner[SCOPE_TOKEN_CAPTURE] = True
    # The prefix is plain ASCII (the id's characters need no escaping): cut it from the raw
    # path as it was sent, unless the client escaped some of it anyway.
    raw: bytes = scope.get("raw_path") or b""
    cut = path[: len(path) - len(rest)].encode()
    inner["path"] = rest
    inner["raw_path"] = raw[len(cut) :] if raw.startswith(cut) else rest.encode()
    return inner


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
    """The ASGI app of ``server``: health, stats, metrics, error handlers and its own
    routes."""

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
        # Prometheus metrics (rollgym.prometheus): what /stats says, and more, for a scraper.
        Route(METRICS_ENDPOINT, metrics_endpoint(_exposition(server)), methods=["GET"]),
        *server.routes(),
    ]
    return App(server, routes)


def _exposition(server: BaseServer) -> Exposition:
    """What ``server``'s ``/metrics`` answers (``rollgym.server.metrics``)."""

    def families() -> Iterable[Metric]:
        # Imported here: it imports prometheus_client, which ``render`` has checked is there.
        from rollgym.server.metrics import server_families

        return server_families(server)

    return Exposition(families, ("rollgym.http.metrics", "rollgym.server.metrics"))


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ROLLOUT_ID_CHARS",
    "App",
    "JSONResponse",
    "build_app",
    "error_response",
    "unprefixed",
]
