"""``collect.budget`` with ``in_flight: abandon`` on a Ray run: the run stops within one rollout
of its cap, the rollouts in flight on the workers are cancelled and left unrecorded (counted as
abandoned in ``run.json`` and ``cost.json``), and ``--resume`` finishes the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect.rundir import EXIT_BUDGET
from rollgym.ray import run_on_ray
from rollgym.wire import COST_FIELD
from tests.support.ledger import assert_recorded_once, ledger_counts
from tests.support.stack import stack_config, write_tasks

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
    # The rollouts the workers were running are abandoned, said so, and not recorded.
    assert 0 < budget["abandoned"] <= 80 - len(rollouts)
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
