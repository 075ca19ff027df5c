"""``rollgym chaos``: a fault-injecting proxy in front of any running server."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollgym.cli.args import http_url
from rollgym.cli.kit import PlainHelpCommand
from rollgym.errors import ConfigError

if TYPE_CHECKING:
    from rollgym.config import ChaosSpec


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand)
    def chaos(
        upstream: Annotated[
            str, typer.Argument(help="URL of the server to put faults in front of.")
        ],
        spec: Annotated[
            Path,
            typer.Option(help="YAML/JSON file with the fault schedule (see the README)."),
        ],
        port: Annotated[int, typer.Option(help="Port to listen on (127.0.0.1); 0 picks one.")] = 0,
        name: Annotated[str, typer.Option(help="Server name in injected error bodies.")] = "chaos",
    ) -> None:
        """Forward every request to UPSTREAM, injecting the faults of --spec on a seeded,
        reproducible schedule (5xx/4xx answers, connection resets, delays, hangs, bad JSON).
        Point a client or a config's `url:` at the printed URL. Ctrl-C stops it."""
        import yaml
        from pydantic import ValidationError

        from rollgym import runtime
        from rollgym.config import ChaosSpec, format_validation_error

        try:
            data = yaml.safe_load(spec.read_text())
            chaos_spec = ChaosSpec.model_validate(data)
        except OSError as exc:
            raise ConfigError(f"{spec}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{spec}: not valid YAML: {exc}") from None
        except ValidationError as exc:
            raise ConfigError(format_validation_error(str(spec), exc)) from None
        upstream = http_url(upstream, "UPSTREAM")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port {port}: not a port number (0 to 65535; 0 picks one)")
        runtime.run(_serve(upstream, chaos_spec, port, name))


async def _serve(upstream: str, spec: ChaosSpec, port: int, name: str) -> None:
    import asyncio  # here, not at the top: `rollgym --help` does not need it

    from rollgym.chaos import chaos_proxy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        try:
            url, proxy = await stack.enter_async_context(
                chaos_proxy(upstream, spec, name=name, port=port)
            )
        except OSError as exc:
            raise ConfigError(
                f"--port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} "
                "(choose another port, or 0 for a free one)"
            ) from None
        print(f"chaos proxy for {upstream} listening on {url}", flush=True)
        await stop.wait()
        print(f"stopped; {proxy.stats()}", flush=True)
