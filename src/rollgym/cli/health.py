"""``rollgym health``: check a run directory, write DIR/health.json, print the table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand

EXIT_FAILED = 1
EXIT_UNREADABLE = 2

HELP = (
    "Check the run in DIR: the ledger invariant (one record per row of tasks.jsonl, no "
    "duplicates), NeMo Gym 0.7's rollout checks (missing and hollow agent turns, zero "
    "completion tokens, missing token counts, runaway generations, token-count mismatches, "
    "tasks that always fail or are always unhealthy) "
    "and rollgym's own (failure rate and bursts by server over time, token drift, retries per "
    "model call and per server, rollout attempts, masked samples, and the share of groups "
    "whose rewards are all equal: no learning signal for GRPO). Each check fails when its "
    "value exceeds its threshold (--max CHECK=VALUE overrides one). Writes DIR/health.json and "
    "prints a table. Exit 0 when every judged check passes, 1 when one fails, 2 when DIR "
    "cannot be read (the file and line are named). Streams the files; a torn last line (a run "
    "killed mid-write) is a warning."
)


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=HELP)
    def health(
        out: Annotated[Path, typer.Argument(metavar="DIR", help="Output directory of the run.")],
        max_: Annotated[
            list[str] | None,
            typer.Option(
                "--max",
                metavar="CHECK=VALUE",
                help="CHECK=VALUE: fail CHECK above VALUE instead of its default (repeatable; "
                "a count, or a rate from 0 to 1).",
            ),
        ] = None,
        skip: Annotated[
            list[str] | None,
            typer.Option("--skip", metavar="CHECK", help="A check not to run (repeatable)."),
        ] = None,
        window: Annotated[
            float,
            typer.Option(
                metavar="SECONDS",
                help="Seconds per time window of failure_bursts and of no_signal_groups' timeline.",
            ),
        ] = 60.0,
        write: Annotated[
            bool, typer.Option("--write/--no-write", help="Write DIR/health.json.")
        ] = True,
        json_: Annotated[
            bool, typer.Option("--json", help="Print health.json's contents, not the table.")
        ] = False,
    ) -> None:
        import orjson

        from rollgym.errors import RollgymError
        from rollgym.health import check_run, write_health
        from rollgym.health.checks import known, thresholds
        from rollgym.health.show import table

        try:
            limits = thresholds(max_)
            report = check_run(out, limits, known(skip, "--skip"), window)
            written = write_health(report) if write else None
        except RollgymError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(EXIT_UNREADABLE) from None
        if json_:
            sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
            sys.stdout.write("\n")
        else:
            typer.echo(table(report))
            if written:
                typer.echo(f"health: {written}")
        if report.exit_code:
            raise typer.Exit(EXIT_FAILED)
