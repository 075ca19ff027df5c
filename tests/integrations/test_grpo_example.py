"""``examples/grpo_trl.py`` runs (2 short steps, as its docstring's smoke command), so the example
cannot rot: the whole loop starts, TRL trains on rollgym's rollouts, and it prints a reward per
step and writes its figures."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

EXAMPLE = Path(__file__).parents[2] / "examples" / "grpo_trl.py"


def test_the_grpo_example_runs_two_steps(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "2", "--generations", "4", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=800,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in printed] == ["1", "2"], done.stdout
    with open(out / "rewards.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["step"]) for r in rows] == [1.0, 2.0]
    assert all(0.0 <= float(r["reward"]) <= 1.0 for r in rows)
    assert all(float(r["masked"]) == 0.0 for r in rows)
    assert (out / "rewards.svg").read_text().startswith("<svg")
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["step-1", "step-2"]
