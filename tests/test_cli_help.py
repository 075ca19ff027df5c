"""``--help`` in one style everywhere (click's plain layout: rich's boxes cut long option names
and its markup eats ``[extra]``), usage lines that name arguments as the text does, and a top
level ``--help`` that imports only what it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROLLGYM = str(Path(sys.executable).parent / "rollgym")
COMMANDS = [
    [], ["serve"], ["run"], ["collect"], ["chaos"], ["check"], ["report"], ["reverify"],
    ["serve-model"], ["serve-openenv"], ["health"], ["tasks"], ["tasks", "reasoning-gym"],
]  # fmt: skip
BOX = "╭─│╰"


def help_of(command: list[str]) -> str:
    done = subprocess.run(
        [ROLLGYM, *command, "--help"], env={**os.environ, "COLUMNS": "80"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "rollgym")
def test_every_help_is_plain_and_names_its_arguments_as_its_text_does(command: list[str]) -> None:
    text = help_of(command)
    assert not any(mark in text for mark in BOX), text
    usage = text.splitlines()[0]
    assert usage.startswith(f"Usage: rollgym {' '.join(command)}".rstrip()), usage
    # typer's "{config}" is a placeholder no reader knows to replace; the text says CONFIG.
    assert "{" not in usage, usage
    words = usage.split()[3 + len(command) :]
    assert all(w.isupper() or w.startswith("[") for w in words), usage


def test_the_usage_line_names_the_argument_the_help_text_speaks_of() -> None:
    assert help_of(["run"]).splitlines()[0] == "Usage: rollgym run [OPTIONS] CONFIG"
    assert help_of(["health"]).splitlines()[0] == "Usage: rollgym health [OPTIONS] DIR"


# Run as `rollgym --help` is, then list what it imported.
IMPORTS = """\
import json, sys
sys.argv = ["rollgym", "--help"]
from rollgym.cli.main import main
try:
    main()
except SystemExit:
    pass
heavy = ("asyncio", "rich", "pydantic", "yaml", "uvicorn", "starlette", "aiohttp", "ssl")
print(json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr)
"""


def test_the_top_level_help_imports_nothing_it_does_not_show() -> None:
    # A count of modules, not a timing: what `rollgym --help` costs is what it imports.
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: rollgym" in done.stdout
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
