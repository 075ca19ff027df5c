"""``rollgym serve-openenv``: a config's environment served as an OpenEnv environment."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand
from rollgym.errors import ConfigError
from rollgym.extras import install_command
from rollgym.launch.timeouts import STARTUP_TIMEOUT

if TYPE_CHECKING:
    from rollgym.config import Config


def register(app: typer.Typer) -> None:
    @app.command("serve-openenv", cls=PlainHelpCommand)
    def serve_openenv(
        config: Annotated[Path, typer.Argument(help="YAML config naming the environment.")],
        env: Annotated[str, typer.Option(help="The resources server to serve.")],
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (0: a free one, printed).")] = 0,
        max_sessions: Annotated[
            int, typer.Option(help="OpenEnv's max_concurrent_envs: sessions at once.")
        ] = 64,
        accept_rows: Annotated[
            bool,
            typer.Option(
                "--accept-rows",
                help="reset(**row) takes a task row of the caller's too. A row names its own "
                "expected answer: only for callers trusted to choose what is paid (a "
                "trainer's own dataset). Without it, reset picks a row of collect.input.",
            ),
        ] = False,
        write_url: Annotated[
            Path | None, typer.Option(help="Write the OpenEnv server's URL here once it is up.")
        ] = None,
        startup_timeout: Annotated[
            float, typer.Option(help="Seconds to wait for the servers' /health.")
        ] = STARTUP_TIMEOUT,
        log_level: Annotated[str, typer.Option(help="Log level of the servers.")] = "WARNING",
    ) -> None:
        """Start CONFIG's servers (all but its agents), then serve resources server ENV as an
        OpenEnv environment (openenv-core's /ws, /reset, /step, /schema) until Ctrl-C or
        SIGTERM. reset(task_index=i) or reset(seed=s) picks a row of collect.input; with
        --accept-rows, reset(**row) takes a row itself. Needs the openenv extra (pip install 'rollgym[openenv]')."""
        from rollgym import runtime
        from rollgym.cli.kit import setup_logging
        from rollgym.config import load_config

        setup_logging(log_level)
        cfg = load_config(config)
        server = cfg.servers.get(env)
        if server is None or server.kind != "resources":
            known = [n for n, s in cfg.servers.items() if s.kind == "resources"]
            raise ConfigError(f"{config}: --env {env!r} is not a resources server ({known})")
        runtime.run(
            _serve(cfg, env, host, port, max_sessions, accept_rows, write_url, startup_timeout)
        )


def _tasks(cfg: Config) -> list[dict[str, object]]:
    from rollgym.collect.tasks import iter_tasks

    if cfg.collect.input is None:
        return []
    return list(iter_tasks(cfg.base_dir() / cfg.collect.input))


async def _serve(
    cfg: Config,
    env: str,
    host: str,
    port: int,
    max_sessions: int,
    accept_rows: bool,
    write_url: Path | None,
    timeout: float,
) -> None:
    import asyncio

    import uvicorn

    from rollgym.http import Target
    from rollgym.launch import Supervisor
    from rollgym.launch.ports import bind_socket

    try:
        from rollgym.openenv.serve import openenv_app
    except ImportError as exc:
        raise ConfigError(
            f"serve-openenv needs openenv-core: {install_command('openenv')} ({exc})"
        ) from None
    tasks = _tasks(cfg)
    if not tasks and not accept_rows:
        raise ConfigError(
            f"{cfg.source or 'the config'}: collect.input has no tasks to serve, and callers' "
            "rows are refused: set collect.input, or give --accept-rows"
        )
    servers = {n: s for n, s in cfg.servers.items() if s.kind not in ("agent", "environment")}
    run_cfg = cfg.model_copy(update={"servers": servers})
    supervisor = Supervisor(run_cfg, log_level="WARNING", startup_timeout=timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        urls = await supervisor.start()
        target = Target(env, tuple(urls[env]), cfg.servers[env].retry)
        app = openenv_app(target, tasks=tasks, max_concurrent_envs=max_sessions, rows=accept_rows)
        sock = bind_socket(host, port)
        url = f"http://{host}:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        async with asyncio.timeout(timeout):
            while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn has no event)
                await asyncio.sleep(0.02)
        print(f"OpenEnv environment {env!r} ({len(tasks)} tasks) at {url} (WebSocket {url}/ws)")
        if write_url is not None:
            await asyncio.to_thread(_write, write_url, url)
        await asyncio.wait(
            [task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
        )
        server.should_exit = True
        async with asyncio.timeout(10):
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await supervisor.stop()
        if write_url is not None:
            await asyncio.to_thread(write_url.unlink, missing_ok=True)


def _write(path: Path, text: str) -> None:
    # Through a temporary file: whoever polls for this file must never read half of it.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
