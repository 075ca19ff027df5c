"""NeMo Gym's own collector, ``gym eval run --no-serve``, against a running ``GymStack``, and
what it wrote (0.7's files: sheet §6).

    run = eval_run(stack, rows, out / "a", "+num_repeats=2", "+route_failures_to_sidecar=true")
    assert run.code == 0, run.output
    run.rollouts, run.failures, run.materialized, run.aggregate, run.by_key()

For ``-o DIR/rollouts.jsonl`` 0.7 writes ``rollouts.jsonl`` (results, masked ones too),
``rollouts_failures.jsonl`` (the sidecar), ``rollouts_materialized_inputs.jsonl`` (the rows
after routing and repeats) and ``rollouts_aggregate_metrics.json`` (one entry per Environment
Server); 0.4 writes the first and the last.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interop.nemo import GymStack
from interop.rollgym_side import read_jsonl, write_jsonl

# NeMo Gym's identity of one rollout in its records and sidecar rows.
TASK_INDEX, ROLLOUT_INDEX = "_ng_task_index", "_ng_rollout_index"


@dataclass
class EvalRun:
    """One ``gym eval run --no-serve``: exit code, console output and the files it wrote."""

    code: int
    output: str
    out: Path

    def _jsonl(self, suffix: str) -> list[dict[str, Any]]:
        return read_jsonl(self.out / f"rollouts{suffix}.jsonl")

    @property
    def rollouts(self) -> list[dict[str, Any]]:
        return self._jsonl("")

    @property
    def failures(self) -> list[dict[str, Any]]:
        return self._jsonl("_failures")

    @property
    def materialized(self) -> list[dict[str, Any]]:
        return self._jsonl("_materialized_inputs")

    @property
    def aggregate(self) -> list[dict[str, Any]]:
        path = self.out / "rollouts_aggregate_metrics.json"
        return json.loads(path.read_text()) if path.exists() else []

    def by_key(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Every record, result or sidecar row, by ``(task index, rollout index)``."""
        return {(r[TASK_INDEX], r[ROLLOUT_INDEX]): r for r in self.rollouts + self.failures}


def eval_run(
    stack: GymStack, rows: list[dict[str, Any]], out: Path, *overrides: str, timeout: float = 600
) -> EvalRun:
    """``gym eval run --no-serve`` of ``rows`` against ``stack`` (its head server), output in
    ``out``; ``overrides``: Hydra arguments (``+num_repeats=2``, ``+agent_name=...``,
    ``'+environment_server_routes={mcqa\\:example: NAME}'``)."""
    out.mkdir(parents=True, exist_ok=True)
    tasks = write_jsonl(out / "tasks.jsonl", rows)
    args = [
        stack.gym.gym,
        "eval",
        "run",
        "--no-serve",
        f"+input_jsonl_fpath={tasks}",
        f"+output_jsonl_fpath={out / 'rollouts.jsonl'}",
        f"+head_server={{host: 127.0.0.1, port: {stack.head_port}}}",
        *overrides,
    ]
    env = {**os.environ, "RAY_ADDRESS": "local", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        args, cwd=out, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    (out / "gym-eval-run.log").write_text(done.stdout + done.stderr)
    return EvalRun(done.returncode, (done.stdout + done.stderr)[-6000:], out)
