"""The ``rollgym`` command line. One module per command; errors end as one clear line."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rollgym.errors import RollgymError
from rollgym.extras import extras_help
from rollgym.import_path import drop_working_directory

app = typer.Typer(
    name="rollgym",
    help=(
        "Collect reinforcement-learning rollouts from HTTP environments; every rollout ends as "
        "a recorded result or a typed failure.\n\n"
        "Exit codes of run/collect: 0 all rollouts succeeded; 1 the run completed but some "
        "rollouts failed; 2 the run could not start or was aborted; 3 it stopped at its "
        "collect.budget."
    ),
    epilog=extras_help(),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain text, as every command's own --help (PlainHelpCommand): rich's markup would read
    # "pip install 'rollgym[openenv]'" in a command's help as a style tag and print "rollgym".
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from rollgym.version import __version__

        typer.echo(f"rollgym {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Collect reinforcement-learning rollouts from HTTP environments."""


def _register() -> None:
    from rollgym.cli import (
        audit,
        chaos,
        check,
        health,
        replay,
        report,
        reverify,
        run,
        serve,
        serve_model,
        serve_openenv,
        tasks,
    )

    serve.register(app)
    run.register(app)
    chaos.register(app)
    check.register(app)
    audit.register(app)
    report.register(app)
    reverify.register(app)
    replay.register(app)
    serve_model.register(app)
    serve_openenv.register(app)
    health.register(app)
    tasks.register(app)


def main() -> None:
    # Before any command imports a run's code: no file in the working directory replaces it.
    drop_working_directory()
    _register()
    try:
        app()
    except RollgymError as err:
        # Imported here: `rollgym --help` need not pay for rich.
        from rich.console import Console
        from rich.markup import escape

        # The message is text, not markup: "pip install 'rollgym[metrics]'" must print whole.
        Console(stderr=True).print(
            f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True
        )
        sys.exit(2)
