"""``collect.budget`` with ``in_flight: abandon`` on a Ray run: the run stops within one rollout
of its cap, the rollouts in flight on the workers are cancelled and left unrecorded (counted as
abandoned in ``run.json`` and ``cost.json``: those started, as a local run counts them, not
those queued on a worker), and ``--resume`` finishes the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect.rollout import RolloutPolicy
from rollgym.collect.rundir import EXIT_BUDGET
from rollgym.ray import RayDispatcher, run_on_ray
from rollgym.wire import COST_FIELD
from tests.support.ledger import assert_recorded_once, ledger_counts
from tests.support.stack import (
    run_held_to_an_abandon_cap,
    running_stack,
    stack_config,
    write_tasks,
)

pytestmark = pytest.mark.timeout(400)  # two runs on Ray: minutes on a loaded 2-core machine


def _tokens(line: dict[str, Any]) -> int:
    cost = line[COST_FIELD]
    return int(cost["input_tokens"] + cost["output_tokens"])


async def test_an_abandon_budget_stops_a_ray_run_within_one_rollout_of_its_cap(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cap = 600
    # Each model call takes 0.3 s: with 8 rollouts at once on two workers, some are always in
    # flight when the cap is reached.
    slow = {"options": {"latency": 0.3}}
    config = stack_config(
        {"repeats": 2, "concurrency": 8, "budget": {"tokens": cap, "in_flight": "abandon"}},
        model=slow, replicas=1,
    )  # fmt: skip
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    out = tmp_path / "out"
    outcome = await run_on_ray(config, config.collect, tasks, out, workers=2, progress=False)
    assert outcome.status == "stopped_at_budget", outcome.abort_reason
    assert outcome.exit_code == EXIT_BUDGET
    rollouts, failures = assert_recorded_once(out)
    assert failures == []
    tokens = [_tokens(line) for line in rollouts]
    # At the cap, and past it by less than the one rollout that reached it.
    assert sum(tokens) >= cap and sum(tokens) - max(tokens) < cap, tokens
    info = orjson.loads((out / "run.json").read_bytes())
    budget = info["budget"]
    assert budget["in_flight"] == "abandon" and budget["tokens"] == sum(tokens)
    # The rollouts the workers were running are abandoned, said so, and not recorded; with
    # those never started, they are the run's pending rollouts.
    assert 0 < budget["abandoned"] <= 80 - len(rollouts)
    assert budget["abandoned"] + budget["not_started"] == 80 - len(rollouts)
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost["abandoned_in_flight"] == budget["abandoned"]

    # Nothing recorded is lost: --resume with a larger budget finishes the run.
    bigger = stack_config({"repeats": 2, "concurrency": 8, "budget": {"tokens": 10**9}},
                          replicas=1)  # fmt: skip
    again = await run_on_ray(bigger, bigger.collect, tasks, out, resume=True, progress=False)
    assert again.exit_code == 0, again.abort_reason
    assert ledger_counts(out) == (80, 0)
    assert [orjson.loads(x) for x in (out / "rollouts.jsonl").read_bytes().splitlines()][
        : len(rollouts)
    ] == rollouts


async def test_abandoned_on_ray_counts_what_started_not_what_was_queued(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """One worker with 4 slots is handed 8 rollouts (two chunks of 4: 4 run, 4 wait at its
    gate). Once 4 are held at the model, one is let on: its slot goes to a queued rollout, and
    its record reaches the cap. Abandoned are the 4 started and not recorded (as a local run
    counts them: ``tests/collect/test_cost.py``), not the 7 handed to the worker; the 3 never
    started are ``not_started``."""
    made: list[RayDispatcher] = []
    async with running_stack(model_options={"hold_each": True}) as stack:
        policy = RolloutPolicy.from_collect(stack_config().collect)
        made.append(RayDispatcher(policy, 4, workers=1))
        outcome = await run_held_to_an_abandon_cap(stack, tmp_path, 8, 4, made[0])
        reached = len(stack.model.holding)
    assert outcome.status == "stopped_at_budget", outcome.abort_reason
    out = tmp_path / "out"
    rollouts, failures = assert_recorded_once(out)
    assert len(rollouts) == 1 and failures == []
    budget = orjson.loads((out / "run.json").read_bytes())["budget"]
    assert budget["abandoned"] == 4 and budget["not_started"] == 3, budget
    # Ground truth: every rollout that reached the model and is not recorded is abandoned.
    assert 3 <= reached - 1 <= budget["abandoned"], reached
    assert outcome.metrics["cost"]["abandoned_in_flight"] == 4
