"""``rollgym run --ray --metrics-port``: every process of the run serves Prometheus metrics and
is listed in ``scrape_targets.json`` (Prometheus's ``file_sd`` format): the collector, each
server replica on the cluster, and each collect worker actor, on the local two-node cluster.
Every model call is held (the model's hold file) while the test scrapes, so the numbers are
known; a worker killed meanwhile comes back on a new port and the file follows it."""

from __future__ import annotations

import asyncio
import os
import signal
from http.client import HTTPException
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect.scrape_targets import TARGETS_FILE
from rollgym.ray import run_on_ray
from tests.prometheus.scrape import Samples, maybe, scrape, value
from tests.support.ledger import ledger_counts
from tests.support.stack import stack_config, write_tasks
from tests.support.waiting import wait_until

# Above the sum of the bounded waits inside (120 s for the targets, 120 s for every slot to
# wait, 120 s for a killed worker's restart, then the run): on a busy machine a Ray worker's
# restart alone has taken most of a minute.
pytestmark = pytest.mark.timeout(480)

CONCURRENCY = 8


def _targets(out: Path) -> dict[str, list[str]]:
    """rollgym_process (and server name) -> the URLs scraped, from the targets file."""
    got: dict[str, list[str]] = {}
    for group in orjson.loads((out / TARGETS_FILE).read_bytes()):
        labels = group["labels"]
        key = labels["rollgym_process"] + (
            f":{labels['rollgym_server']}" if "rollgym_server" in labels else ""
        )
        path = labels.get("__metrics_path__", "/metrics")
        got.setdefault(key, []).extend(f"http://{t}{path}" for t in group["targets"])
    return got


async def _scrape_all(urls: list[str]) -> list[Samples]:
    return list(await asyncio.gather(*(scrape(u) for u in urls)))


async def test_a_ray_run_lists_and_serves_metrics_for_every_process(
    ray_cluster: Any, node_ids: set[str], tmp_path: Path
) -> None:
    hold, held = tmp_path / "hold", tmp_path / "held.log"
    hold.touch()
    options = {"hold_while_exists": str(hold), "held_log": str(held)}
    config = stack_config(
        {"repeats": 2, "concurrency": CONCURRENCY},
        model={"impl": "tests.support.servers:FaultyModel", "options": options},
        replicas=2,
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", 12)
    out = tmp_path / "out"
    run = asyncio.create_task(
        run_on_ray(config, config.collect, tasks, out, workers=2, progress=False, metrics_port=0)
    )
    try:
        await wait_until(
            lambda: (out / TARGETS_FILE).exists() or run.done(), 120, "the scrape targets"
        )
        assert not run.done(), run.result()
        targets = _targets(out)
        assert sorted(targets) == [
            "collect_worker", "collector", "server:agent", "server:env", "server:model",
        ]  # fmt: skip
        assert len(targets["collect_worker"]) == 2
        assert len(targets["server:agent"]) == len(targets["server:model"]) == 2
        run_json = orjson.loads((out / "run.json").read_bytes())
        assert run_json["scrape_targets"] == TARGETS_FILE
        assert targets["collector"] == [run_json["metrics_url"]]

        workers = targets["collect_worker"]

        async def all_in_flight() -> bool:
            samples = await _scrape_all(workers)
            return sum(maybe(s, "rollgym_rollouts_in_flight") or 0 for s in samples) == (
                CONCURRENCY
            )

        for _ in range(1200):  # bounded: until every slot waits on the held model
            if await all_in_flight() or run.done():
                break
            await asyncio.sleep(0.1)
        assert not run.done()
        assert await all_in_flight(), "the rollouts never all waited on the model"
        scraped = await _scrape_all(workers)
        infos = []
        for samples in scraped:
            ((_, labels),) = [k for k in samples if k[0] == "rollgym_worker_info"]
            infos.append(dict(labels))
            in_flight = value(samples, "rollgym_rollouts_in_flight")
            # each rollout in flight made its one call to an agent replica, which is waiting
            assert value(samples, "rollgym_calls_total", server="agent") == in_flight
            assert value(samples, "rollgym_worker_rollouts_total") == 0
        assert sorted(i["worker"] for i in infos) == ["0", "1"]
        assert {i["node_id"] for i in infos} == node_ids
        # every server replica on the cluster answers its own /metrics
        for key in ("server:agent", "server:model", "server:env"):
            for samples in await _scrape_all(targets[key]):
                assert value(samples, "rollgym_server_info", server=key.split(":")[1],
                             kind={"agent": "agent", "model": "model"}.get(
                                 key.split(":")[1], "resources")) == 1  # fmt: skip

        # Worker 0's process dies: Ray restarts it on a new port, the file follows it.
        victim = next(i for i in infos if i["worker"] == "0")
        os.kill(int(victim["pid"]), signal.SIGKILL)

        def moved() -> bool:
            now = _targets(out).get("collect_worker", [])
            return len(now) == 2 and set(now) != set(workers)

        await wait_until(lambda: moved() or run.done(), 120, "the restarted worker's target")
        assert not run.done()
        fresh = _targets(out)["collect_worker"]
        assert len(set(fresh) & set(workers)) == 1  # the other worker did not move
        (new_url,) = set(fresh) - set(workers)
        new = await scrape(new_url)
        (info,) = [dict(k[1]) for k in new if k[0] == "rollgym_worker_info"]
        assert info["worker"] == "0" and info["pid"] != victim["pid"]
    finally:
        hold.unlink(missing_ok=True)
    outcome = await run
    assert outcome.status == "completed", outcome.abort_reason
    assert ledger_counts(out) == (24, 0)
    # The targets live as long as the run: the file is gone, the workers' ports closed.
    assert not (out / TARGETS_FILE).exists()
    info = orjson.loads((out / "run.json").read_bytes())["ray"]
    assert {w["metrics_url"] for w in info["workers"]} == set(fresh)
    # Nothing of this run answers there. Not "nothing answers": a freed port may be taken at
    # once by another process (Ray starts processes of its own, binding ports the OS picks).
    pids = {str(w["pid"]) for w in info["workers"]}
    for url in fresh:
        try:
            samples = await scrape(url)
        except (OSError, HTTPException, AssertionError, ValueError):
            continue  # refused (the URLError expected), or not a metrics page: not a worker's
        served = [dict(k[1]) for k in samples if k[0] == "rollgym_worker_info"]
        assert not [s for s in served if s.get("pid") in pids], (url, served)
