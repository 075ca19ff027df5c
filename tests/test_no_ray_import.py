"""Without ``--ray``, rollgym never imports Ray: not on import, not during a whole local run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import stack_data, write_tasks

pytestmark = pytest.mark.timeout(90)

PROGRAM = """
import sys
import rollgym.cli.main, rollgym.collect, rollgym.trainer, rollgym.launch, rollgym.http
import rollgym.agents.tool_agent, rollgym.models.scripted, rollgym.envs.echo.server
assert "ray" not in sys.modules, "importing rollgym imported ray"

from rollgym.trainer import RolloutClient
from rollgym.cli.main import main

sys.argv = ["rollgym", "run", sys.argv[1], "--output", sys.argv[2], "--no-progress"]
try:
    main()
except SystemExit as done:
    code = done.code
assert code == 0, f"rollgym run exited with {code}"
assert "ray" not in sys.modules, "a local run imported ray"
print("no ray")
"""


def test_rollgym_runs_without_importing_ray(tmp_path: Path) -> None:
    # Outside tests/ray on purpose: that folder is skipped when Ray is not installed, which is
    # exactly when this must hold.
    write_tasks(tmp_path / "tasks.jsonl", 3)
    config = stack_data({"repeats": 2, "input": "tasks.jsonl"})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(config_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no ray" in done.stdout


def test_rollgym_ray_does_import_ray() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, rollgym.ray; assert 'ray' in sys.modules"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
