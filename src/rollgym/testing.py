"""Helpers for testing servers for real: uvicorn on 127.0.0.1 with an OS-assigned port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn

from rollgym.config import RetryPolicy, ServerConfig, ServerLimits, kind_defaults
from rollgym.dialects import SERVER_DIALECTS
from rollgym.http import Target
from rollgym.launch.ports import bind_socket
from rollgym.server.app import build_app
from rollgym.server.base import BaseServer, ServerContext, resolve_impl
from rollgym.server.cpu_pool import WARM_UP_TIMEOUT
from rollgym.server.headers import limited_http
from rollgym.server.resources import ResourcesServer
from rollgym.serving import in_thread  # the one sync bridge, shared with serve_config

__all__ = ["bind_socket", "in_thread", "rl_stack", "serve_asgi", "serve_server", "spin"]


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
    dialects: tuple[Any, ...] = SERVER_DIALECTS,
) -> AsyncIterator[tuple[str, BaseServer]]:
    """Build a rollgym server from ``impl`` and serve it for real; yield (url, server).
    ``dialects``: what it speaks beside rollgym's own protocol (default: every dialect a
    launched server speaks, ``rollgym.dialects``)."""
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
    server = klass(ServerContext(name, cfg, dict(peers or {}), tuple(dialects)))
    async with serve_asgi(build_app(server), limits=cfg.limits, name=name) as url:
        # Ready, as a launched server is when the launcher returns: a scoring pool warms up
        # after the server answers (``/health`` says ``starting``), within its own bound.
        if isinstance(server, ResourcesServer):
            await asyncio.wait_for(server.warmed(), WARM_UP_TIMEOUT + 30)
        yield url, server


@asynccontextmanager
async def rl_stack(
    model_dir: Path, env: str | type[BaseServer], *, env_name: str = "env", max_queue: int = 64
) -> AsyncIterator[tuple[str, str]]:
    """A training stack on 127.0.0.1 for tests: the CPU backend serving ``model_dir``,
    ``openai_proxy`` with ``return_token_ids`` in front of it, environment ``env`` (a class,
    which need not be importable by name) and rollgym's tool agent, all in this event loop;
    yields (agent URL, backend URL). A config's servers as processes: ``rollgym.serve_config``."""

    def policy(kind: str) -> RetryPolicy:
        return RetryPolicy.model_validate(kind_defaults(kind))  # type: ignore[arg-type]

    async with AsyncExitStack() as stack:
        backend, _ = await stack.enter_async_context(
            serve_server(
                "rollgym.models.local:LocalModel",
                name="policy",
                options={"model_dir": str(model_dir), "max_queue": max_queue},
            )
        )
        proxy, _ = await stack.enter_async_context(
            serve_server(
                "openai_proxy",
                name="model",
                options={"base_url": f"{backend}/v1", "return_token_ids": True},
            )
        )
        env_url, _ = await stack.enter_async_context(serve_server(env, name=env_name))
        peers = {
            "model": Target.single("model", proxy, policy("model")),
            env_name: Target.single(env_name, env_url, policy("resources")),
        }
        agent, _ = await stack.enter_async_context(
            serve_server(
                "tool_agent",
                name="agent",
                options={"model": "model", "resources": env_name},
                peers=peers,
            )
        )
        yield agent, backend


def spin(seconds: float) -> float:
    """Burn CPU for ``seconds`` (a stand-in for a stuck verifier; picklable for process pools)."""
    import time

    end = time.monotonic() + seconds
    x = 0.0
    while time.monotonic() < end:
        x += 1.0
    return x
