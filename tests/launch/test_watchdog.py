"""A server process that dies mid-run is restarted and the run completes; one that keeps dying
stops the run with its name, exit code and log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from rollgym.collect import run_collection
from rollgym.launch import Supervisor
from tests.support.ledger import ledger_counts
from tests.support.stack import stack_config, write_tasks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


async def test_a_killed_server_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    # The servers' default backoff (0.1 s, doubling), not the tests' tiny one: with that, a
    # rollout refused by the dead env fails in milliseconds, and how many fail before the
    # watchdog sees the death would measure the client's speed, not the restart.
    cfg = stack_config(
        {"concurrency": 4, "repeats": 2, "max_failure_rate": None},
        model={"options": {"latency": 0.02}},
        retry={"budget": {"enabled": False}, "breaker": {"enabled": False}},
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", 60)
    out = tmp_path / "out"
    supervisor = Supervisor(cfg, log_dir=out / "logs")
    run = asyncio.create_task(
        run_collection(cfg, cfg.collect, tasks, out, supervisor, progress=False)
    )
    await wait_until(lambda: (out / "rollouts.jsonl").exists() and len(
        (out / "rollouts.jsonl").read_bytes().splitlines()) >= 10, 60, "10 rollouts")  # fmt: skip
    supervisor.kill("env")
    outcome = await run
    assert outcome.status in ("completed", "completed_with_failures"), outcome.abort_reason
    succeeded, failed = ledger_counts(out)
    assert succeeded + failed == 120
    # Only what was in flight on the env when it died, or sent before the watchdog saw it.
    assert failed <= 12, failed
    assert outcome.metrics["restarts"] == {"env.0": 1}
    # The restarted env served the rest of the run.
    assert succeeded >= 100


async def test_a_crash_loop_aborts_the_run_naming_the_server(tmp_path: Path) -> None:
    cfg = stack_config(
        {"concurrency": 2, "max_failure_rate": None}, env={"impl": "tests.launch.dying:DiesSoon"}
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2000)
    out = tmp_path / "out"
    outcome = await run_collection(
        cfg, cfg.collect, tasks, out, Supervisor(cfg, log_dir=out / "logs"), progress=False
    )
    assert outcome.status == "aborted" and outcome.exit_code == 2
    reason = outcome.abort_reason or ""
    assert reason.startswith("server env keeps crashing: exited with code 3 after 3 restarts")
    assert "many-worlds database is corrupt" in reason  # the last lines of its log
    assert outcome.metrics["restarts"] == {"env.0": 3}
    run_info = orjson.loads((out / "run.json").read_bytes())
    assert run_info["abort"]["reason"] == reason
