"""``rollgym report``: write OUT/report.html and print a short summary."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand
from rollgym.errors import ConfigError

HELP = (
    "Write OUT/report.html: one self-contained file (no network needed to open it) with the "
    "reward distribution, pass@k against k, per-task pass rates and the hardest tasks, failures "
    "by type / server / status and over time, latency per hop, throughput over time, retries "
    "and circuit events; and print a short summary. Works on a finished, aborted, resumed or "
    "still running run. --compare overlays other runs (e.g. another checkpoint) with per-task "
    "deltas against OUT."
)


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=HELP)
    def report(
        out: Annotated[Path, typer.Argument(help="Output directory of the run.")],
        compare: Annotated[
            list[Path] | None,
            typer.Option("--compare", help="Another run's directory to overlay (repeatable)."),
        ] = None,
    ) -> None:
        from rollgym.report import write_report

        for path in (out, *(compare or [])):
            if not path.is_dir():
                raise ConfigError(f"{path}: no such run directory")
        started = time.monotonic()
        made = write_report(out, compare)
        typer.echo(made.summary)
        typer.echo(
            f"report: {made.path} ({made.size / 1e6:.1f} MB, {time.monotonic() - started:.1f}s)"
        )
