"""The README's example (``example_gate.py``, quoted verbatim) run as a script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.health.seeded import answer, clean_except, rollout, tool_turn

EXAMPLE = Path(__file__).with_name("example_gate.py")


def run_example(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, EXAMPLE, root], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_gate_passes_a_clean_run_and_stops_a_hollow_one(tmp_path: Path) -> None:
    done = run_example(clean_except(tmp_path / "well", 4, 3, {}))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert (tmp_path / "well" / "health.json").exists()
    hollow = {(0, r): rollout(0, r, output=[*tool_turn(), answer("")]) for r in range(3)}
    done = run_example(clean_except(tmp_path / "sick", 4, 3, hollow))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("hollow_turns: 0.25 > 0.02 (rollouts with a model turn")
    assert (
        lines[1].strip()
        == "rollouts.jsonl:1 (task 0, rollout 0): turn 2 of 2 has no text and no tool call"
    )
    assert "tasks_always_unhealthy: 1 > 0" in done.stdout
