"""``rollgym serve``: start a config's servers and keep them up until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from rollgym.cli.kit import PlainHelpCommand
from rollgym.errors import LaunchError
from rollgym.launch.timeouts import STARTUP_TIMEOUT, WARMUP_TIMEOUT

if TYPE_CHECKING:
    from rollgym.config import Config


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand)
    def serve(
        config: Annotated[Path, typer.Argument(help="YAML config naming the servers.")],
        write_urls: Annotated[
            Path | None,
            typer.Option(
                help="Write the servers' URLs as JSON here once all are healthy "
                "(for `collect --servers`)."
            ),
        ] = None,
        startup_timeout: Annotated[
            float, typer.Option(help="Seconds to wait for every /health.")
        ] = STARTUP_TIMEOUT,
        warmup_timeout: Annotated[
            float,
            typer.Option(
                help="Seconds, from its start, for a server whose /health says it is warming "
                "up (a scoring pool: math, reasoning_gym) to be ready."
            ),
        ] = WARMUP_TIMEOUT,
        log_level: Annotated[str, typer.Option(help="Log level of the servers.")] = "WARNING",
    ) -> None:
        """Start every server of CONFIG on 127.0.0.1 (free ports unless fixed), wait until all
        are healthy, print their URLs, and stop them all on Ctrl-C or SIGTERM.

        Exit code 0: the servers ran and were stopped; 2: the config is invalid or a server
        could not start (its log is shown)."""
        from rollgym import runtime
        from rollgym.cli.kit import setup_logging
        from rollgym.config import load_config

        setup_logging(log_level)
        cfg = load_config(config)
        runtime.run(_serve(cfg, write_urls, (startup_timeout, warmup_timeout), log_level))


def _print_urls(cfg: Config, urls: dict[str, list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rollgym servers (Ctrl-C stops them)")
    table.add_column("name")
    table.add_column("kind")
    table.add_column("impl")
    table.add_column("url", overflow="fold")
    for name, server in cfg.servers.items():
        table.add_row(name, server.kind, server.impl, ", ".join(urls[name]))
    Console().print(table)  # rich flushes: a script reading the pipe sees it at once


def _write_urls(path: Path, urls: dict[str, list[str]]) -> None:
    # Through a temporary file: whoever polls for this file must never read half of it.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(urls, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


async def _serve(
    cfg: Config, write_urls: Path | None, timeouts: tuple[float, float], log_level: str
) -> None:
    import asyncio  # here, not at the top: `rollgym --help` does not need it

    from rollgym.launch import Supervisor

    startup, warmup = timeouts
    supervisor = Supervisor(
        cfg, log_level=log_level, startup_timeout=startup, warmup_timeout=warmup
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    fatal: list[str] = []

    def crash_loop(reason: str) -> None:
        fatal.append(reason)
        stop.set()

    try:
        urls = await supervisor.start()
        _print_urls(cfg, urls)
        if write_urls is not None:
            await asyncio.to_thread(_write_urls, write_urls, urls)
        # A server that dies is started again; one that keeps dying stops them all.
        watch = asyncio.create_task(supervisor.watch(crash_loop))
        await stop.wait()
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    finally:
        await supervisor.stop()
        if write_urls is not None:
            # Stale URLs would send the next `collect` to servers that are gone.
            await asyncio.to_thread(write_urls.unlink, missing_ok=True)
    if fatal:
        raise LaunchError(fatal[0])
