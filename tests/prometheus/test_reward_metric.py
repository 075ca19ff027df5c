"""``rollgym_reward``: the collector's histogram of rewards by environment, scraped from a real
run (the collector in this process, its ``/metrics`` on a 127.0.0.1 socket, read with
``prometheus_client``'s parser) and counted from the ledger the same run wrote."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollgym.collect import Collector, prepare_run
from rollgym.collect.live import RunWatch
from rollgym.collect.metrics_port import CollectorMetrics
from rollgym.collect.records import ScoredRollout
from rollgym.prometheus.latency import MAX_NAMES, OTHER
from tests.support.stack import SOME_RIGHT, running_stack, stack_config, write_tasks

from .scrape import scrape, value

pytestmark = pytest.mark.timeout(60)


async def test_a_runs_rewards_are_scraped_by_environment(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 8, say=SOME_RIGHT)
    async with running_stack() as stack:
        cfg = stack_config({"repeats": 3})
        prepared = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        metrics = CollectorMetrics("127.0.0.1", 0)
        async with metrics.server:
            collector = Collector(prepared, stack.urls, agent="agent", progress=False)
            metrics.attach(collector)
            await collector.execute()
            got = await scrape(metrics.url)
    rewards = [
        orjson.loads(line)["reward"]
        for line in (tmp_path / "out" / "rollouts.jsonl").read_bytes().splitlines()
    ]
    assert len(rewards) == 24 and 0 < sum(rewards) < 24  # some right, some not
    # The environment is the resources server the agent verifies with: ``env``.
    assert value(got, "rollgym_reward_count", environment="env") == 24
    assert value(got, "rollgym_reward_sum", environment="env") == pytest.approx(sum(rewards))
    zeros = sum(r == 0.0 for r in rewards)
    assert value(got, "rollgym_reward_bucket", environment="env", le="0.0") == zeros
    assert value(got, "rollgym_reward_bucket", environment="env", le="0.9") == zeros
    assert value(got, "rollgym_reward_bucket", environment="env", le="1.0") == 24


def test_environments_are_labelled_and_bounded() -> None:
    watch = RunWatch()
    watch.environment_of = lambda task: f"env{task}"
    for task in range(MAX_NAMES + 10):
        watch(ScoredRollout(task, 0, 0.5, 1, 0.1, {"reward": 0.5}))
    watch(ScoredRollout(0, 1, 1.0, 1, 0.1, {"reward": 1.0, "mask_sample": True}))
    watch(ScoredRollout(0, 2, float("nan"), 1, 0.1, {}))
    by_env = watch.rewards.cumulative()
    assert len(by_env) == MAX_NAMES
    assert by_env["env0"] == (by_env["env0"][0], 0.5)  # the masked and the NaN left out
    assert by_env[OTHER][0][-1] == ("+Inf", 11)
