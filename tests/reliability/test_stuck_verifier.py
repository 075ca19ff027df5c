"""A CPU-bound verifier stuck in an endless loop fails only its own rollout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import EXIT_SOME_FAILED, Collector, prepare_run
from rollgym.config import parse_config
from rollgym.server.resources import Session
from rollgym.testing import spin
from tests.support.servers import CountingEcho
from tests.support.stack import running_stack, stack_config, task_row


class StuckEnv(CountingEcho):
    """The echo env, whose verifier spins for an hour on "stuck" tasks: only the process
    pool's timeout can stop it."""

    verify_timeout = 1.0

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        await self.run_cpu(spin, 3600.0 if task.get("stuck") else 0.0)
        return await super().verify(session, task, response)


@pytest.mark.timeout(60)
async def test_stuck_verifier_fails_only_its_rollout(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(
        b"".join(orjson.dumps({**task_row(i), "stuck": i == 5}) + b"\n" for i in range(12))
    )
    cfg = stack_config({"concurrency": 4})
    async with running_stack(env=StuckEnv, model_retry={"max_attempts": 1}) as stack:
        prepared = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        # Not an hour: the test's timeout bounds it; the deadline is in the failure's type.
        outcome = await Collector(prepared, stack.urls, progress=False).execute()
    assert outcome.exit_code == EXIT_SOME_FAILED
    assert outcome.metrics["counts"] == {"total": 12, "succeeded": 11, "failed": 1, "pending": 0}
    assert outcome.metrics["failures"]["by_type"] == {"deadline_exceeded": 1}
    failure = json.loads((tmp_path / "out" / "failures.jsonl").read_text())
    assert failure["task_index"] == 5


@pytest.mark.timeout(60)
async def test_pool_workers_die_with_their_server(tmp_path: Path) -> None:
    """SIGKILL of a resources server busy in a stuck verifier leaves no pool worker behind."""
    import asyncio
    import signal

    import aiohttp
    import psutil

    from rollgym.launch import Supervisor

    cfg = parse_config(
        {
            "servers": {
                "env": {
                    "kind": "resources",
                    "impl": "tests.reliability.test_stuck_verifier:StuckEnv",
                    "retry": {"max_attempts": 1},
                }
            }
        }
    )
    supervisor = Supervisor(cfg, log_dir=tmp_path / "logs")
    urls = await supervisor.start()
    try:
        proc = psutil.Process(supervisor.pids()[0])
        task = {"responses_create_params": {"input": "x"}, "expected_answer": "x", "stuck": True}
        response = {"output": []}
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(
                http.post(urls["env"][0] + "/verify", json={**task, "response": response})
            )
            workers: list[psutil.Process] = []
            async with asyncio.timeout(30):  # until a worker is spinning in the stuck verify
                while not any(w.status() == psutil.STATUS_RUNNING for w in workers):
                    await asyncio.sleep(0.1)
                    workers = [
                        w
                        for w in proc.children(recursive=True)
                        if "spawn_main" in " ".join(w.cmdline())
                    ]
            proc.send_signal(signal.SIGKILL)
            _, alive = psutil.wait_procs(workers, timeout=30)
            assert not alive, f"orphaned pool workers: {[p.pid for p in alive]}"
            request.cancel()
    finally:
        await supervisor.stop()
