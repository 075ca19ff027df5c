"""NeMo Gym's own collector (``gym eval run --no-serve``) drives rollgym's agent, which NeMo
Gym's ``gym env start`` launched as one of its agent servers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from interop.conftest import Stacks
from interop.nemo import INTEROP_VENV
from interop.rollgym_side import read_jsonl, write_jsonl
from interop.test_nemo_servers import weather_rows

pytestmark = pytest.mark.timeout(300)


def test_gym_eval_run_collects_from_rollgym_agent(stacks: Stacks, out: Path) -> None:
    rows = weather_rows()
    tasks = write_jsonl(out / "tasks.jsonl", rows)
    rollouts = out / "rollouts.jsonl"
    args = [
        str(INTEROP_VENV / "bin" / "gym"),
        "eval",
        "run",
        "--no-serve",
        "+agent_name=rollgym_agent",
        f"+input_jsonl_fpath={tasks}",
        f"+output_jsonl_fpath={rollouts}",
        "+num_repeats=2",
        f"+head_server={{host: 127.0.0.1, port: {stacks.head_port}}}",
    ]
    env = {**os.environ, "RAY_ADDRESS": "local", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(
        args, cwd=out, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = read_jsonl(rollouts)
    assert len(results) == 2 * len(rows)
    assert {r["reward"] for r in results} == {1.0}
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in results} == {
        (t, k) for t in range(len(rows)) for k in range(2)
    }
    # /aggregate_metrics went through rollgym's agent to NeMo Gym's resources server.
    metrics = json.loads((out / "rollouts_aggregate_metrics.json").read_text())
    assert [m["agent_ref"] for m in metrics] == [{"name": "rollgym_agent"}]
    assert metrics[0]["agent_metrics"]["mean/reward"] == 1.0
