"""``rollgym health`` run in the test's own process (registered on an app of its own, so the
tests do not depend on ``rollgym.cli.main`` listing it)."""

from __future__ import annotations

from pathlib import Path

import typer

from rollgym.cli import health


def health_here(*args: str | Path) -> int:
    """Run ``rollgym health ARGS``; its exit code."""
    app = typer.Typer(add_completion=False)
    health.register(app)

    @app.callback()
    def _root() -> None:
        """rollgym."""

    try:
        app(["health", *(str(a) for a in args)], prog_name="rollgym")
    except SystemExit as done:
        return int(done.code or 0)
    raise AssertionError("rollgym health did not exit")
