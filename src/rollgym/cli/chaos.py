"""``rollgym chaos``: placeholder registration; filled by the reliability work."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
