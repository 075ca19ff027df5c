"""Environment metrics are the verifier's numbers: not the task row's own fields echoed back,
nor the agent's fields about its own loop (those are reported apart, in ``agent_fields``)."""

from __future__ import annotations

from pathlib import Path

import orjson

from rollgym.collect.metrics import compute_metrics


def test_numbers_of_the_task_row_are_not_metrics(tmp_path: Path) -> None:
    rows = [
        {"responses_create_params": {"input": "guess"}, "secret": 34, "task_index": i,
         "rollout_index": 0}
        for i in range(2)
    ]  # fmt: skip
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    verified = [
        {**row, "reward": 1.0, "num_steps": 2 + i, "truncated": False, "attempts": 1}
        for i, row in enumerate(rows)
    ]
    (tmp_path / "rollouts.jsonl").write_bytes(b"".join(orjson.dumps(v) + b"\n" for v in verified))
    metrics = compute_metrics(tmp_path, total=2, repeats=1)
    assert metrics.env_metrics == {}
    assert metrics.agent_fields == {"num_steps": 2.5}


def test_agent_fields_are_not_environment_metrics(tmp_path: Path) -> None:
    verified = [
        {"task_index": i, "rollout_index": 0, "reward": 1.0, "lookups": 3 + i, "num_steps": 2,
         "agent_seconds": 0.5 + i, "drifted_turns": i, "truncated": False}
        for i in range(2)
    ]  # fmt: skip
    (tmp_path / "rollouts.jsonl").write_bytes(b"".join(orjson.dumps(v) + b"\n" for v in verified))
    data = compute_metrics(tmp_path, total=2, repeats=1).to_dict()
    assert data["env_metrics"] == {"lookups": 3.5}
    assert data["agent_fields"] == {"agent_seconds": 1.0, "drifted_turns": 0.5, "num_steps": 2.0}
