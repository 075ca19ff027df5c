"""Runs for the report tests: collected for real against the in-process test stack."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollgym.collect import RunningServers, RunOutcome, run_collection
from tests.support.servers import FAIL_MARKER
from tests.support.stack import SOME_RIGHT, Stack, running_stack, stack_config, write_tasks


async def collect(stack: Stack, tasks: Path, out: Path, **collect: Any) -> RunOutcome:
    cfg = stack_config({"concurrency": 4, **collect})
    async with asyncio.timeout(60):
        return await run_collection(
            cfg, cfg.collect, tasks, out, RunningServers(stack.urls), progress=False
        )


async def good_run(tmp: Path, n: int = 12, repeats: int = 4) -> Path:
    """A completed run whose tasks' repeats score differently."""
    tasks = write_tasks(tmp / "tasks.jsonl", n, say=SOME_RIGHT)
    out = tmp / "good"
    async with running_stack() as stack:
        await collect(stack, tasks, out, repeats=repeats)
    return out


async def aborted_run(tmp: Path) -> Path:
    """A run aborted by its failure budget: most tasks make the model answer 500."""
    tasks = write_tasks(tmp / "faulty.jsonl", 120, fail={i for i in range(120) if i % 5})
    out = tmp / "aborted"
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        outcome = await collect(stack, tasks, out, min_failure_samples=20)
    assert outcome.status == "aborted"
    return out
