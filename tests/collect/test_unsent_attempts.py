"""A rollout whose agent refused the connection (nothing was sent) is recorded, but the refusal
does not use up its attempts: however many resumes ran against a dead agent, a resume against
the live one runs every such rollout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect import Collector, prepare_run
from tests.support.ledger import read_jsonl
from tests.support.stack import running_stack, stack_config, write_tasks

pytestmark = pytest.mark.timeout(60)


async def _collect(
    cfg: Any, tasks: Path, out: Path, urls: dict[str, list[str]], resume: bool
) -> Any:
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=resume)
    return await Collector(prepared, urls, progress=False).execute()


async def test_refused_connections_never_use_up_a_rollouts_attempts(
    tmp_path: Path, dead_url: Callable[[], str]
) -> None:
    cfg = stack_config({"max_rollout_attempts": 2, "max_failure_rate": None})
    tasks = write_tasks(tmp_path / "tasks.jsonl", 4)
    out = tmp_path / "out"
    dead = {"agent": [dead_url()]}
    for n in range(3):  # more runs than max_rollout_attempts
        outcome = await _collect(cfg, tasks, out, dead, resume=n > 0)
        assert outcome.metrics["counts"]["failed"] == 4
        failures = read_jsonl(out / "failures.jsonl")
        assert {f["error"]["type"] for f in failures} == {"connect_error"}
        assert {f["attempts"] for f in failures} == {0}  # nothing reached the agent
    async with running_stack() as stack:
        outcome = await _collect(cfg, tasks, out, stack.urls, resume=True)
    assert outcome.status == "completed", outcome.abort_reason
    assert outcome.metrics["counts"]["succeeded"] == 4
