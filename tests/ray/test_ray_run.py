"""``--ray``: servers with replicas on both nodes, collection over worker actors, one ledger;
its metrics match a local run of the same tasks (the scripted model is deterministic per
rollout key)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest
import ray

from rollgym.collect import EXIT_ABORTED, Collector, prepare_run
from rollgym.errors import LaunchError
from rollgym.launch import Supervisor
from rollgym.ray import run_on_ray
from tests.support.ledger import assert_recorded_once, ledger_counts
from tests.support.stack import SOME_RIGHT, stack_config, write_tasks

pytestmark = pytest.mark.timeout(150)

COMPARED = ("counts", "reward", "pass_at_k", "failures", "env_metrics")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


async def _local_run(config: Any, tasks: Path, out: Path) -> dict[str, Any]:
    prepared = prepare_run(config, config.collect, tasks, out, resume=False)
    supervisor = Supervisor(config, log_dir=out / "logs")
    try:
        urls = await supervisor.start()
        outcome = await Collector(prepared, urls, progress=False).execute()
    finally:
        await supervisor.stop()
    return outcome.metrics


async def test_ray_run_matches_a_local_run(
    ray_cluster: Any, node_ids: set[str], tmp_path: Path
) -> None:
    config = stack_config({"repeats": 4, "concurrency": 16}, replicas=2, env_replicas=2)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 30, say=SOME_RIGHT)

    outcome = await run_on_ray(
        config, config.collect, tasks, tmp_path / "ray", workers=2, progress=False
    )
    assert outcome.status == "completed", outcome.abort_reason
    assert ledger_counts(tmp_path / "ray") == (120, 0)

    local = await _local_run(config, tasks, tmp_path / "local")
    assert ledger_counts(tmp_path / "local") == (120, 0)
    for key in COMPARED:
        # records arrive in another order, so float sums may differ in the last bits
        assert _rounded(outcome.metrics[key]) == _rounded(local[key]), key
    assert 0 < outcome.metrics["reward"]["mean"] < 1  # the rewards do vary

    # every server's replicas are on both nodes; both workers did work
    info = outcome.metrics["ray"]
    for name in ("model", "env", "agent"):
        nodes = {r["node_id"] for r in info["replicas"] if r["server"] == name}
        assert nodes == node_ids, name
    assert {w["node_id"] for w in info["workers"]} == node_ids
    assert all(w["rollouts"] > 0 for w in info["workers"])
    assert sum(w["rollouts"] for w in info["workers"]) == 120
    assert outcome.metrics["http"]["agent"]["calls"] == 120
    run_json = orjson.loads((tmp_path / "ray" / "run.json").read_bytes())
    assert run_json["status"] == "completed"
    assert run_json["ray"]["replicas"] == info["replicas"]


async def test_ray_run_resumes_without_redoing_successes(ray_cluster: Any, tmp_path: Path) -> None:
    config = stack_config({"repeats": 2}, replicas=1)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 10)
    out = tmp_path / "out"
    first = await run_on_ray(config, config.collect, tasks, out, progress=False)
    assert first.status == "completed"
    before = (out / "rollouts.jsonl").read_bytes()
    again = await run_on_ray(config, config.collect, tasks, out, resume=True, progress=False)
    assert again.status == "completed"
    assert again.metrics["timing"]["rollouts_this_session"] == 0
    assert (out / "rollouts.jsonl").read_bytes() == before


@pytest.mark.timeout(400)  # two whole runs on Ray: minutes on a loaded 2-core machine
async def test_ray_run_aborts_on_its_failure_budget_then_resumes(
    ray_cluster: Any, down_model: str, tmp_path: Path
) -> None:
    broken = stack_config({"repeats": 3, "max_failures": 3}, model={"url": down_model}, replicas=1)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    out = tmp_path / "out"
    aborted = await run_on_ray(broken, broken.collect, tasks, out, progress=False)
    assert aborted.status == "aborted" and aborted.abort_reason
    assert aborted.exit_code == EXIT_ABORTED
    counts = aborted.metrics["counts"]
    assert counts["failed"] >= 3 and counts["pending"] > 0
    assert_recorded_once(out)

    # The model is back: --resume redoes the failed and the pending rollouts, nothing else.
    fixed = stack_config({"repeats": 3, "max_rollout_attempts": 5}, replicas=1)
    done = await run_on_ray(fixed, fixed.collect, tasks, out, resume=True, progress=False)
    assert done.status == "completed", done.abort_reason
    assert ledger_counts(out) == (120, 0)


async def test_a_server_that_cannot_start_fails_the_run_with_a_plain_launch_error(
    ray_cluster: Any, tmp_path: Path
) -> None:
    taken = socket.socket()
    taken.bind((ray.util.get_node_ip_address(), 0))
    taken.listen()
    try:
        config = stack_config(env={"port": taken.getsockname()[1]}, replicas=1)
        tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
        with pytest.raises(LaunchError) as caught:
            await run_on_ray(config, config.collect, tasks, tmp_path / "out", progress=False)
    finally:
        taken.close()
    assert type(caught.value) is LaunchError  # not Ray's wrapper
    assert caught.value.server == "env" and "cannot listen" in caught.value.message


def test_the_cli_runs_on_the_cluster_with_ray_address(ray_cluster: Any, tmp_path: Path) -> None:
    """`rollgym run --ray-address` from a separate process joins the cluster and completes."""
    import json
    import os
    import subprocess
    import sys

    config = stack_config({"repeats": 2, "input": "tasks.jsonl"}, replicas=2)
    write_tasks(tmp_path / "tasks.jsonl", 6)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(config.model_dump_json(exclude={"source"}))  # JSON is YAML
    rollgym = str(Path(sys.executable).parent / "rollgym")
    done = subprocess.run(
        [rollgym, "run", str(config_path), "--output", str(tmp_path / "out"), "--no-progress",
         "--ray-address", ray_cluster.address],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "completed"
    ok, failed = ledger_counts(tmp_path / "out")
    assert (ok, failed) == (12, 0)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert "ray" in metrics
