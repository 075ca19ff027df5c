"""``rollgym serve``: start a config's servers and keep them up until Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from rollgym.config import load_config
from rollgym.launch import Supervisor


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        config: Annotated[Path, typer.Argument(help="YAML config naming the servers.")],
        write_urls: Annotated[
            Path | None,
            typer.Option(help="Write the servers' URLs as JSON here (for `collect --servers`)."),
        ] = None,
        startup_timeout: Annotated[
            float, typer.Option(help="Seconds to wait for every /health.")
        ] = 30.0,
        log_level: Annotated[str, typer.Option(help="Log level of the servers.")] = "WARNING",
    ) -> None:
        """Start every server of CONFIG on 127.0.0.1 (free ports unless fixed), wait until all
        are healthy, print their URLs, and stop them all on Ctrl-C or SIGTERM."""
        from rollgym.cli.main import setup_logging

        setup_logging(log_level)
        cfg = load_config(config)
        asyncio.run(_serve(cfg, write_urls, startup_timeout, log_level))


async def _serve(cfg: object, write_urls: Path | None, timeout: float, log_level: str) -> None:
    from rollgym.config import Config

    assert isinstance(cfg, Config)
    supervisor = Supervisor(cfg, log_level=log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    urls = await supervisor.start(timeout=timeout)
    try:
        table = Table(title="rollgym servers (Ctrl-C stops them)")
        table.add_column("name")
        table.add_column("kind")
        table.add_column("impl")
        table.add_column("url")
        for name, server in cfg.servers.items():
            table.add_row(name, server.kind, server.impl, ", ".join(urls[name]))
        Console().print(table)
        if write_urls is not None:
            data = orjson.dumps(urls, option=orjson.OPT_INDENT_2)
            await asyncio.to_thread(write_urls.write_bytes, data)
        await stop.wait()
    finally:
        await supervisor.stop()
