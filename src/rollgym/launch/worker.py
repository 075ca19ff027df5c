"""One server process: ``main`` serves one server of a run. Started as ``python -P -m
rollgym.cli.worker`` (``WORKER``; ``-P``: the working directory is not on the import path, so no
file there replaces the server's code), the entry point that hands it the dialects.

The supervisor passes a listening socket (so ports are chosen before any server starts, with no
race) and a JSON spec on another descriptor (``--spec-fd``, read once and closed: never in the
environment, which whatever the server starts would inherit): the server's name, the run's
config and the URLs of every server, so each one knows where the others are.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Any

import uvicorn

from rollgym import tracing
from rollgym.config import ChaosSpec, Config
from rollgym.credentials import MaskedStream, remember_secret, remember_urls_in
from rollgym.errors import redact_text
from rollgym.launch.process import read_spec
from rollgym.lifeline import die_with_parent
from rollgym.runtime import claim_process, tune_gc
from rollgym.server.app import build_app
from rollgym.server.base import ServerContext, resolve_impl
from rollgym.server.headers import limited_http

__all__ = ["main"]
KEEPALIVE_S = 75  # above the client pool's 30 s, so the client closes idle connections first


def main(dialects: tuple[Any, ...] = ()) -> None:
    """Serve the server the spec on ``--spec-fd`` names, speaking ``dialects`` besides its own
    protocol (``rollgym.server.base.ServerContext.dialects``)."""
    spec = read_spec(sys.argv)
    # The credentials this server alone needs from the environment (api_key_env): given here,
    # not inherited, so /proc/<pid>/environ holds none.
    for var, value in spec.get("env", {}).items():
        os.environ[var] = value
        remember_secret(value)
    # Everything this process writes (its log: logging, uvicorn, tracebacks) is masked of the
    # run's credentials in any form an upstream may echo them (rollgym.credentials).
    remember_urls_in(spec["config"])
    sys.stdout = MaskedStream(sys.stdout, redact_text)
    sys.stderr = MaskedStream(sys.stderr, redact_text)
    # SIGTERM when the launching process dies (set here, not in a preexec_fn: those can
    # deadlock in a threaded parent such as a Ray worker), and exit if it is already gone.
    die_with_parent(signal.SIGTERM, spec.get("parent"))
    name: str = spec["name"]
    logging.basicConfig(
        level=spec.get("log_level", "WARNING"),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    config = Config.model_validate(spec["config"])
    server_cfg = config.servers[name]
    tracing.setup(f"rollgym-{name}")  # on only if OTEL_TRACES_EXPORTER asks (rollgym.tracing)
    # ``impl: module:Class`` may name a module beside the config file (see resolve_impl).
    klass = resolve_impl(
        server_cfg.impl, server_cfg.kind, config_dir=config.base_dir(),
        where=f"{config.source}: servers.{name}.impl",
    )  # fmt: skip
    server = klass(ServerContext.from_run(name, config, spec["urls"], dialects))
    sock = socket.socket(fileno=int(spec["fd"]))
    claim_process()
    tune_gc()  # start-up is done: what it built is frozen out of every later collection
    uv_config = uvicorn.Config(
        build_app(server),
        loop="uvloop",
        http=limited_http(server_cfg.limits, name),  # httptools, with header limits (431)
        log_level=spec.get("log_level", "warning").lower(),
        access_log=False,
        timeout_keep_alive=KEEPALIVE_S,
        proxy_headers=False,  # servers are reached directly; parsing forwarded headers costs
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    if server_cfg.chaos is None:
        uvicorn.Server(uv_config).run(sockets=[sock])
        return
    import uvloop

    uvloop.run(_serve_behind_chaos(uvicorn.Server(uv_config), sock, server_cfg.chaos, name))


async def _serve_behind_chaos(
    server: uvicorn.Server, public: socket.socket, spec: ChaosSpec, name: str
) -> None:
    """Serve on a private port with the chaos proxy on the public socket, in one loop."""
    from aiohttp import web

    from rollgym.chaos import ChaosProxy
    from rollgym.launch.ports import bind_socket

    private = bind_socket()
    upstream = f"http://127.0.0.1:{private.getsockname()[1]}"
    runner = web.AppRunner(ChaosProxy(upstream, spec, name).app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, public).start()
    try:
        await server.serve(sockets=[private])  # returns on SIGTERM/SIGINT
    finally:
        await runner.cleanup()
