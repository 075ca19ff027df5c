"""Helpers for testing servers for real: uvicorn on 127.0.0.1 with an OS-assigned port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from rollgym.config import ServerConfig, ServerLimits
from rollgym.http import Target
from rollgym.launch.ports import bind_socket
from rollgym.server.app import build_app
from rollgym.server.base import BaseServer, ServerContext, resolve_impl
from rollgym.server.headers import limited_http

__all__ = ["bind_socket", "serve_asgi", "serve_server", "spin"]


@asynccontextmanager
async def serve_asgi(
    app: Any,
    *,
    timeout: float = 10.0,
    limits: ServerLimits | None = None,
    name: str = "server",
) -> AsyncIterator[str]:
    """Serve an ASGI app on a real socket in the current event loop; yield its base URL.
    Requests are held to ``limits`` (the defaults if None), as a launched server's are."""
    sock = bind_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", timeout_keep_alive=75, access_log=False,
        http=limited_http(limits or ServerLimits(), name),
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(timeout):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(timeout):
                await task
        except TimeoutError:
            task.cancel()
        sock.close()


@asynccontextmanager
async def serve_server(
    impl: str | type[BaseServer],
    *,
    name: str = "server",
    kind: str | None = None,
    options: dict[str, Any] | None = None,
    peers: dict[str, Target] | None = None,
    retry: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[str, BaseServer]]:
    """Build a rollgym server from ``impl`` and serve it for real; yield (url, server)."""
    klass = resolve_impl(impl) if isinstance(impl, str) else impl
    cfg = ServerConfig.model_validate(
        {
            "kind": kind or klass.kind,
            "impl": impl if isinstance(impl, str) else f"{klass.__module__}:{klass.__name__}",
            "options": options or {},
            "retry": retry or {},
            "limits": limits or {},
        }
    )
    server = klass(ServerContext(name=name, config=cfg, peers=dict(peers or {})))
    async with serve_asgi(build_app(server), limits=cfg.limits, name=name) as url:
        yield url, server


def spin(seconds: float) -> float:
    """Burn CPU for ``seconds`` (a stand-in for a stuck verifier; picklable for process pools)."""
    import time

    end = time.monotonic() + seconds
    x = 0.0
    while time.monotonic() < end:
        x += 1.0
    return x
