"""``rollgym check``: start an environment and check it (``rollgym.check``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand

EXIT_PROBLEM = 1


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand)
    def check(
        config: Annotated[Path, typer.Argument(help="The environment's config (YAML).")],
        server: Annotated[
            str | None,
            typer.Option(help="The resources server to check (default: the config's only one)."),
        ] = None,
        limit: Annotated[int, typer.Option(help="Example rows to check with (first N).")] = 20,
    ) -> None:
        """Start the servers of CONFIG and check its environment: tool schemas, verify on the
        example rows with a reference and a wrong answer, determinism, isolated sessions, the
        uniform error body. Exit 0 when every check passes, 1 on a problem, 2 if the servers
        cannot start."""
        from rich.console import Console
        from rich.markup import escape

        from rollgym import runtime
        from rollgym.check import check_env
        from rollgym.config import load_config

        cfg = load_config(config)
        report = runtime.run(check_env(cfg, server, limit=limit))
        console = Console(highlight=False, soft_wrap=True)
        # Names and details are text, not markup (a detail may quote "[...]").
        console.print(
            f"checking environment [bold]{escape(report.env)}[/] of {escape(str(config))}"
        )
        for f in report.findings:
            mark = "[green]PASS[/]" if f.ok else "[bold red]FAIL[/]"
            console.print(f"  {mark} {escape(f.check)}: {escape(f.detail)}")
        verdict = "[green]all checks passed[/]" if report.ok else "[bold red]problems found[/]"
        console.print(verdict)
        if not report.ok:
            raise typer.Exit(EXIT_PROBLEM)
