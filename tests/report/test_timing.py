"""Per-hop timing: every rollout record says how long each hop took, and what it retried."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollgym.server.agent import TIMING_FIELD
from tests.report.runs import collect
from tests.support.ledger import read_jsonl
from tests.support.stack import running_stack, write_tasks

pytestmark = pytest.mark.timeout(60)


async def test_every_rollout_record_carries_its_hops(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 6)
    async with running_stack() as stack:
        await collect(stack, tasks, tmp_path / "out", repeats=2)
    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    assert len(rollouts) == 12
    for rec in rollouts:
        timing = rec[TIMING_FIELD]
        # The test script: seed, a model call asking for echo, the tool, a model call, verify.
        assert [len(timing[h]) for h in ("seed", "model", "tool", "verify")] == [1, 2, 1, 1]
        hops = timing["seed"] + timing["model"] + timing["tool"] + timing["verify"]
        assert all(s > 0 for s in hops)
        assert sum(hops) <= timing["total_s"] <= rec["duration_s"]
        assert timing["retries"] == {} and timing["wait_s"] == 0.0
        assert timing["end"] > 1.7e9  # wall-clock seconds


async def test_retries_and_their_waits_are_counted_per_hop(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 4)
    # The model answers 500 for its first 30 ms; the agent's client retries (up to 8 attempts,
    # 10-20 ms apart), so the first model calls succeed after a retry or two.
    async with running_stack(
        model_options={"down_for": 0.03}, model_retry={"max_attempts": 8}
    ) as stack:
        await collect(stack, tasks, tmp_path / "out", concurrency=4)
        faults = stack.model.faults
    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    retried = [r[TIMING_FIELD] for r in rollouts if r[TIMING_FIELD]["retries"]]
    assert faults > 0 and retried
    assert sum(t["retries"]["model"] for t in retried) <= faults
    assert all(set(t["retries"]) == {"model"} and t["wait_s"] > 0 for t in retried)
