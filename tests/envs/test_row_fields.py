"""Every bundled environment declares the row fields it reads (``row_fields``): a run of its own
example config warns about no field of its own rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollgym.collect.tasks import ROLLGYM_ROW_FIELDS
from rollgym.config import load_config
from rollgym.server.base import resolve_impl

ENVS_DIR = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs"
BUNDLED = sorted(p.parent.name for p in ENVS_DIR.glob("*/config.yaml"))
UNREAD = "no server of the run says it reads"


def test_the_bundled_configs_are_all_here() -> None:
    assert set(BUNDLED) >= {"lookup", "mcqa", "math", "guess", "code", "judge"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("env", BUNDLED)
def test_a_bundled_run_does_not_warn_about_its_own_fields(env: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "rollgym", "run", str(ENVS_DIR / env / "config.yaml"),
         "--output", str(out), "--limit", "2", "--repeats", "1", "--no-progress"],
        capture_output=True, text=True, timeout=140, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert UNREAD not in proc.stderr, proc.stderr
    run = json.loads((out / "run.json").read_text())
    assert not [w for w in run.get("warnings", []) if UNREAD in w]


@pytest.mark.parametrize("impl", ["echo", "lookup", "mcqa", "math", "guess", "code", "judge"])
def test_every_bundled_environment_declares_its_row_fields(impl: str) -> None:
    assert resolve_impl(impl, "resources").row_fields


@pytest.mark.parametrize("env", BUNDLED)
def test_the_servers_of_a_bundled_config_declare_every_field_of_its_rows(env: str) -> None:
    # What the collector's warning compares, without a run: the rows' fields against the
    # row_fields its servers report in /health.
    config = load_config(ENVS_DIR / env / "config.yaml")
    assert config.collect.input
    lines = (config.base_dir() / config.collect.input).read_text(encoding="utf-8").splitlines()
    fields = {key for line in lines if line.strip() for key in json.loads(line)}
    declared: set[str] = set()
    for server in config.servers.values():
        if server.impl is not None:
            klass = resolve_impl(server.impl, server.kind, config_dir=config.base_dir())
            declared |= klass.row_fields or set()
    assert fields - ROLLGYM_ROW_FIELDS - declared == set()
