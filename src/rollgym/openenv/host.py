"""``impl: openenv``: an OpenEnv environment's own app, started by rollgym as a server of the run.

    openenv_echo:
      kind: resources
      impl: openenv
      options: {app: "echo_env.server.app:app"}    # or a module:function returning the app

The app (openenv-core's ``create_app(...)``, with its ``/ws``, ``/reset``, ``/step``,
``/schema``) is served unchanged behind rollgym's ``/health`` and ``/stats``, so the launcher
starts it, waits for it and stops it like any other server, and ``openenv_agent`` drives it. Its
``max_concurrent_envs`` is the app's own. A module is found beside the config as for ``impl:``.
An OpenEnv server already running elsewhere needs none of this: give it as ``url:``.

The app's own startup hooks (openenv-core's idle-session reaper) run with the server's.

It answers ``GET /fingerprint`` for the app: every ``.py`` file of the app's top-level package
(loaded or not: a scoring module the app imports at its first step counts from the start), the
other files of the app module's folder, the version of the distribution that installed it
(``Fingerprint.of_app``). An OpenEnv server given by ``url:`` is
not rollgym's: it serves no fingerprint, and ``run.json`` records it as unknown, saying so.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from typing import Any

from pydantic import Field
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollgym.errors import ConfigError
from rollgym.extras import extra_for, missing_hint
from rollgym.server.base import BaseServer, ServerContext
from rollgym.server.fingerprint import Fingerprint, fingerprint_route
from rollgym.wire import OPENENV_FEATURE

log = logging.getLogger("rollgym.server")


class OpenEnvHost(BaseServer):
    """Serves the OpenEnv app named by option ``app`` (``module:attribute``)."""

    kind = "resources"

    class Options(BaseServer.Options):
        app: str = Field(
            pattern=r"^[\w.]+:\w+$", description="module:attribute of the app, or of a factory"
        )

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.app = load_app(self.options.app, where=f"servers.{self.name}.options.app")
        # Once, at start: what scores its episodes (its package's files, loaded or not).
        self.fingerprint = Fingerprint.of_app(self.options.app.partition(":")[0])

    def routes(self) -> list[BaseRoute]:
        return [
            fingerprint_route(self.fingerprint),
            Mount("/", app=_Guard(QuietClose(self.app), self.name)),
        ]

    def features(self) -> list[str]:
        return [OPENENV_FEATURE]

    async def startup(self) -> None:
        for hook in getattr(getattr(self.app, "router", None), "on_startup", ()):
            await _call(hook)

    async def shutdown(self) -> None:
        for hook in getattr(getattr(self.app, "router", None), "on_shutdown", ()):
            await _call(hook)
        await super().shutdown()


class _Guard:
    """The mounted app, except that an exception it raises after it has answered (FastAPI
    answers 500 and then raises again) stops there: rollgym's own error handler would start a
    second answer on the same connection, and the client would see the connection reset."""

    def __init__(self, app: Any, server: str) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] in ("http.response.start", "websocket.accept")
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            if not started:
                raise  # nothing answered yet: rollgym's uniform error body (500)
            log.warning(
                "%s: the OpenEnv app failed after answering %s",
                self.server,
                scope.get("path"),
                exc_info=True,
            )


class QuietClose:
    """An OpenEnv app whose close of a WebSocket the client has already closed is a no-op.

    openenv-core's ``/ws`` handler closes the socket in a ``finally`` and catches only
    ``RuntimeError`` there. Its own client sends ``close`` and then closes the socket at once,
    so the handler's close usually comes second: uvicorn refuses it (``ClientDisconnected``),
    Starlette raises ``WebSocketDisconnect`` from it, and uvicorn logs a 60-line traceback for
    an episode that ended well. Closing a closed socket has nothing left to do."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if message["type"] != "websocket.close":
                await send(message)
                return
            # The client closed first: the close handshake is over, nothing is left to close.
            with contextlib.suppress(OSError):
                await send(message)

        await self.app(scope, receive, closing)


def load_app(path: str, *, where: str) -> Any:
    """The ASGI app at ``module:attribute`` (called first if it is a function)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ImportError) and extra_for(exc.name) is not None:
            hint = f" ({missing_hint(exc)})"  # openenv-core itself missing: the extra
        raise ConfigError(
            f"{where}: importing {module_name} failed: {type(exc).__name__}: {exc}{hint}"
        ) from None
    app = getattr(module, attr, None)
    if app is None:
        raise ConfigError(f"{where}: {module_name} has no {attr!r}")
    if inspect.isfunction(app):
        app = app()
    if not callable(app):
        raise ConfigError(f"{where}: {path} is not an ASGI app")
    return app


async def _call(hook: Any) -> None:
    result = hook()
    if inspect.isawaitable(result):
        await result
