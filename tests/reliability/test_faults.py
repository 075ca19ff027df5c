"""Faults against real server processes: soak, fail-fast abort, hangs, a model that dies.

Servers are started by the real Supervisor (one process each, on 127.0.0.1); the collector runs
in the test's event loop so the test can kill and restart a server mid-run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollgym.collect import EXIT_ABORTED, EXIT_OK, Collector, prepare_run
from rollgym.launch import Supervisor
from tests.support.ledger import ledger_counts, read_jsonl
from tests.support.stack import FAST_BACKOFF, stack_config, write_tasks


def make_config(model: dict[str, Any] | None = None, **collect: Any) -> Any:
    """The stack with fast backoff, and the retry budget and breakers on: these runs are
    about how they behave under faults."""
    return stack_config(collect, model=model, retry=FAST_BACKOFF)


async def run_collection(cfg: Any, tasks: Path, out: Path, *, resume: bool = False) -> Any:
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=resume)
    supervisor = Supervisor(cfg, log_dir=out / "logs")
    try:
        urls = await supervisor.start()
        return await Collector(prepared, urls, progress=False).execute()
    finally:
        await supervisor.stop()


@pytest.mark.timeout(120)
async def test_soak_10pct_503_1pct_reset_loses_nothing(tmp_path: Path) -> None:
    chaos = {
        "seed": 11,
        "paths": ["/v1/responses"],
        "faults": [
            {"kind": "status", "status": 503, "rate": 0.10},
            {"kind": "reset_after", "rate": 0.01},
        ],
    }
    cfg = make_config({"chaos": chaos}, concurrency=128, repeats=40)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 25)  # 1,000 rollouts
    outcome = await run_collection(cfg, tasks, tmp_path / "out")
    ok, failed = ledger_counts(tmp_path / "out")
    assert ok + failed == 1000
    # 10% 503 with 3 attempts: a model call fails for good about 1 time in 1,000.
    assert ok >= 980, outcome.metrics["failures"]
    assert outcome.metrics["reward"]["mean"] == pytest.approx(1.0)


@pytest.mark.timeout(60)
async def test_always_failing_model_aborts_fast_with_summary(tmp_path: Path) -> None:
    chaos = {
        "seed": 1,
        "faults": [{"kind": "status", "status": 500, "rate": 1.0}],
        "paths": ["/v1/responses"],
    }
    cfg = make_config(
        {"chaos": chaos}, concurrency=32, repeats=10, max_failure_rate=0.5, min_failure_samples=20
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", 100)  # 1,000 rollouts
    outcome = await run_collection(cfg, tasks, tmp_path / "out")  # "fast": the counts below
    assert outcome.exit_code == EXIT_ABORTED
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "aborted"
    abort = run["abort"]
    assert abort["by_server"].get("model", 0) >= 20
    assert "500" in abort["by_status"]
    assert "injected 500" in abort["sample_error"]["body"]
    # Retried under the model policy (at most 3 attempts), or cut short by the retry budget:
    # which failures finish first depends on timing, so each is checked for one or the other.
    assert 1 <= abort["max_attempts_per_request"] <= 3
    for line in (tmp_path / "out" / "failures.jsonl").read_text().splitlines():
        chain = _origins(json.loads(line)["error"])  # the agent's 502 and what it carried
        model = [e for e in chain if e.get("server") == "model"]
        attempts = max(e.get("attempts", 1) for e in model)  # to_record: 1 is left out
        spent = any(e["type"] == "budget_exhausted" for e in model)
        assert 1 <= attempts <= 3 and (attempts >= 2 or spent), chain
    # Nothing near the full 1,000 was tried: the run stopped early.
    ok, failed = outcome.metrics["counts"]["succeeded"], outcome.metrics["counts"]["failed"]
    assert ok == 0 and failed < 200


@pytest.mark.timeout(60)
async def test_hanging_model_costs_one_rollout_deadline(tmp_path: Path) -> None:
    chaos = {
        "seed": 3,
        "paths": ["/v1/responses"],
        "faults": [{"kind": "hang", "rate": 0.05, "seconds": 3600}],
    }
    cfg = make_config({"chaos": chaos}, concurrency=64, repeats=10, rollout_timeout=1.5)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 20)
    # Its timeout (60 s) would catch a run that waited on a 3,600 s hang.
    outcome = await run_collection(cfg, tasks, tmp_path / "out")
    ok, failed = ledger_counts(tmp_path / "out")
    assert failed > 0 and ok > 150
    assert set(outcome.metrics["failures"]["by_type"]) == {"deadline_exceeded"}


@pytest.mark.timeout(90)
async def test_model_killed_and_restarted_mid_run_loses_nothing(tmp_path: Path) -> None:
    # No failure budget: this test is about losing nothing while the model is down (with the
    # default budget the outage's failures would abort the run, which --resume also finishes).
    cfg = make_config(
        {"options": {"latency": 0.02}},
        concurrency=16,
        repeats=20,
        max_rollout_attempts=3,
        max_failure_rate=None,
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", 20)  # 400 rollouts
    out = tmp_path / "out"
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    supervisor = Supervisor(cfg, log_dir=out / "logs")
    try:
        urls = await supervisor.start()
        collector = Collector(prepared, urls, progress=False)
        run = asyncio.create_task(collector.execute())
        async with asyncio.timeout(30):
            while collector.ledger.succeeded < 60:  # noqa: ASYNC110 - polling a counter
                await asyncio.sleep(0.02)
        supervisor.kill("model")
        await asyncio.sleep(0.5)
        await supervisor.restart("model")
        outcome = await run
    finally:
        await supervisor.stop()
    ok_before, failed = ledger_counts(out)
    assert failed > 0, "killing the model should have failed some rollouts"
    assert ok_before > 60
    first_ids = {r["response"]["id"] for r in read_jsonl(out / "rollouts.jsonl")}
    assert outcome.exit_code != EXIT_OK
    # Resume finishes the failed ones and redoes no success.
    resumed = await run_collection(cfg, tasks, out, resume=True)
    assert resumed.exit_code == EXIT_OK
    ok_after, failed_after = ledger_counts(out)
    assert (ok_after, failed_after) == (400, 0)
    rows = read_jsonl(out / "rollouts.jsonl")
    kept = [r for r in rows if r["response"]["id"] in first_ids]
    assert len(kept) == ok_before
    assert all(r["attempts"] == 1 for r in kept)
    assert any(r["attempts"] == 2 for r in rows)


@pytest.mark.timeout(30)
async def test_server_rejects_bad_bodies_and_keeps_serving(tmp_path: Path) -> None:
    from rollgym.server.app import MAX_BODY_BYTES
    from rollgym.testing import serve_server

    async with serve_server("echo") as (url, _server), aiohttp.ClientSession() as http:
        async with http.post(url + "/verify", data=b"{not json") as resp:
            assert resp.status == 400
            body = await resp.json()
            assert body["error"]["type"] == "invalid_request"
        big = b"x" * (MAX_BODY_BYTES + 1)
        async with http.post(url + "/seed_session", data=big) as resp:
            assert resp.status == 413

        async def chunks() -> Any:  # chunked: no content-length to refuse it by
            for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
                yield b"x" * (1 << 20)

        async with http.post(url + "/seed_session", data=chunks()) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["status"] == 413
        async with http.post(url + "/echo", json={"text": "still alive"}) as resp:
            assert resp.status == 200
            assert (await resp.json()) == {"echo": "still alive"}


@pytest.mark.timeout(90)
async def test_open_circuit_holds_rollouts_instead_of_failing_them(tmp_path: Path) -> None:
    # One rollout at a time. The model fails its first 6 requests: two calls of 3 attempts,
    # two failed rollouts, and the agent's breaker for the model opens. The next rollout is
    # refused by the open circuit; the collector holds it until the breaker's probe, which
    # the recovered model answers, and it succeeds like every rollout after it.
    chaos = {"seed": 0, "paths": ["/v1/responses"], "sequence": [500] * 6}
    model = {
        "chaos": chaos,
        "retry": {**FAST_BACKOFF, "breaker": {"consecutive_failures": 2, "cooldown": 1.0}},
    }
    cfg = make_config(model, concurrency=1, repeats=2)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 4)  # 8 rollouts
    outcome = await run_collection(cfg, tasks, tmp_path / "out")
    ok, failed = ledger_counts(tmp_path / "out")
    assert (ok, failed) == (6, 2), outcome.metrics["failures"]
    assert outcome.metrics["failures"]["by_type"] == {"http_status": 2}
    model_calls = outcome.metrics["servers"]["agent"]["model"]
    assert model_calls["circuit_rejected"] >= 1  # the circuit did open and refuse a call


def _origins(error: dict[str, Any]) -> list[dict[str, Any]]:
    """An error answer and every error under it (``origin``), outermost first."""
    chain = [error]
    while isinstance(chain[-1].get("origin"), dict):
        chain.append(chain[-1]["origin"])
    return chain
