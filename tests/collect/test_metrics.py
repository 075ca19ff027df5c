"""pass@k and run metrics against hand-computed values."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect.metrics import compute_metrics, pass_at_k
from tests.support.ledger import read_jsonl


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 1, 1, 0.25),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 0, 4, 0.0),
        (4, 4, 1, 1.0),
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),  # 1 - 21/252
        (3, 2, 2, 1.0),  # every pair holds a pass
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c"), [(n, c) for n in range(1, 7) for c in range(n + 1)])
def test_pass_at_k_is_the_chance_that_k_of_the_samples_hold_a_pass(n: int, c: int) -> None:
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_refuses_k_above_n() -> None:
    with pytest.raises(ValueError, match="k=3 exceeds n=2"):
        pass_at_k(2, 1, 3)


def _rollout(task: int, rollout: int, reward: float, **extra: Any) -> dict[str, Any]:
    return {"task_index": task, "rollout_index": rollout, "reward": reward, "attempts": 1, **extra}


def _failure(task: int, rollout: int) -> dict[str, Any]:
    model = {"type": "http_status", "status": 500, "server": "model", "attempts": 3}
    error = {"type": "http_status", "status": 502, "server": "agent", "origin": model}
    return {"task_index": task, "rollout_index": rollout, "attempts": 1, "error": error}


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def test_compute_metrics_on_a_hand_written_run(tmp_path: Path) -> None:
    rewards = {0: [1, 0, 0, 0], 1: [1, 1, 0, 0], 2: [0, 0, 0]}  # task 2's 4th rollout failed
    _write(
        tmp_path / "rollouts.jsonl",
        [
            _rollout(t, i, float(r), num_steps=2 + i)
            for t, rs in rewards.items()
            for i, r in enumerate(rs)
        ],
    )
    _write(tmp_path / "failures.jsonl", [_failure(2, 3)])

    m = compute_metrics(tmp_path, total=12, repeats=4)

    assert (m.total, m.succeeded, m.failed) == (12, 11, 1)
    assert m.reward_mean == pytest.approx(3 / 11)  # the failure is not a reward of 0
    assert m.reward_std == pytest.approx(math.sqrt(3 / 11 * (1 - 3 / 11)))
    # Task by task: pass@1 = .25, .5, 0; pass@2 = .5, 5/6, 0; pass@3 = .75, 1, 0;
    # pass@4 only for the tasks with 4 scored rollouts: 1, 1.
    assert m.pass_at_k == pytest.approx(
        {"pass@1": 0.75 / 3, "pass@2": (0.5 + 5 / 6) / 3, "pass@3": 1.75 / 3, "pass@4": 1.0}
    )
    assert m.failures_by_server == {"model": 1}  # attributed to where it started
    assert m.failures_by_status == {"500": 1}
    assert m.env_metrics == {}  # the agent's steps are its own field, not the environment's
    assert m.agent_fields == pytest.approx({"num_steps": (14 + 14 + 9) / 11})  # 2 + i steps
    per_task = read_jsonl(tmp_path / "per_task.jsonl")
    assert [(t["scored"], t["passed"], t["failed"]) for t in per_task] == [
        (4, 1, 0),
        (4, 2, 0),
        (3, 0, 1),
    ]


def test_by_environment_splits_the_same_run_by_each_tasks_environment(tmp_path: Path) -> None:
    rewards = {0: [1, 0, 0, 0], 1: [1, 1, 0, 0], 2: [0, 0, 0]}  # as above: task 2 failed once
    _write(
        tmp_path / "rollouts.jsonl",
        [_rollout(t, i, float(r)) for t, rs in rewards.items() for i, r in enumerate(rs)],
    )
    _write(tmp_path / "failures.jsonl", [_failure(2, 3)])

    m = compute_metrics(tmp_path, total=12, repeats=4, groups=["env_a", "env_b", "env_b"])

    a, b = m.by_environment["env_a"], m.by_environment["env_b"]
    assert (a["tasks"], a["succeeded"], a["failed"]) == (1, 4, 0)
    assert (b["tasks"], b["succeeded"], b["failed"]) == (2, 7, 1)
    assert a["reward"]["mean"] == pytest.approx(1 / 4)
    assert b["reward"]["mean"] == pytest.approx(2 / 7)  # the failure is not a reward of 0
    assert b["reward"]["std"] == pytest.approx(math.sqrt(2 / 7 * (1 - 2 / 7)))
    assert a["pass_at_k"]["pass@1"] == pytest.approx(0.25)
    assert b["pass_at_k"]["pass@1"] == pytest.approx(0.25)  # tasks 1 (.5) and 2 (0)
    assert b["failures_by_type"] == {"http_status": 1} and a["failures_by_type"] == {}
    assert m.to_dict()["by_environment"] == m.by_environment
    # One environment (or none named): nothing to break down, metrics.json as before.
    assert "by_environment" not in compute_metrics(tmp_path, 12, 4, groups=["x"] * 3).to_dict()
    assert "by_environment" not in compute_metrics(tmp_path, 12, 4).to_dict()


def test_pass_threshold_decides_what_passes(tmp_path: Path) -> None:
    _write(tmp_path / "rollouts.jsonl", [_rollout(0, 0, 0.5), _rollout(0, 1, 0.2)])
    assert compute_metrics(tmp_path, 2, 2, threshold=1.0).pass_at_k == {
        "pass@1": 0.0,
        "pass@2": 0.0,
    }
    assert compute_metrics(tmp_path, 2, 2, threshold=0.5).pass_at_k == {
        "pass@1": 0.5,
        "pass@2": 1.0,
    }
