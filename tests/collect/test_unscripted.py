"""Rows the scripted model has no script for are warned about when the run starts (they score 0
and nothing fails), and ``rollgym health`` fails such a run for its groups without signal."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson
import pytest

from rollgym.collect import RunningServers, run_collection
from rollgym.collect.unscripted import scripted_models
from rollgym.config import parse_config
from rollgym.health import check_run
from tests.support.stack import ECHO_TOOL, running_stack, stack_config, stack_data, task_row

pytestmark = pytest.mark.timeout(120)


def unscripted_row(index: int) -> dict[str, object]:
    return {
        "responses_create_params": {"input": f"task {index}", "tools": [ECHO_TOOL]},
        "expected_answer": f"v{index}",
    }


async def test_rows_without_a_script_are_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [unscripted_row(0), task_row(1), unscripted_row(2), unscripted_row(3)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "run"
    cfg = stack_config({"repeats": 2})
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with running_stack() as stack:
            async with asyncio.timeout(60):
                await run_collection(
                    cfg, cfg.collect, tasks, out, RunningServers(stack.urls), progress=False
                )
    warned = [r.getMessage() for r in caplog.records if "rollgym_script" in r.getMessage()]
    assert len(warned) == 1  # once per run, not per repeat
    assert warned[0].startswith(
        "3 of 4 task rows (tasks 0, 2, 3) have no metadata.rollgym_script for the scripted "
        "model (servers.model)"
    )
    assert "a stand-in, not a language model" in warned[0]
    assert warned[0] in orjson.loads((out / "run.json").read_bytes())["warnings"]
    # What the warning foretold: every unscripted rollout scored 0, nothing failed...
    rewards = {}
    for line in (out / "rollouts.jsonl").read_bytes().splitlines():
        rec = orjson.loads(line)
        rewards.setdefault(rec["task_index"], []).append(rec["reward"])
    assert {t: rewards[t] for t in (0, 2, 3)} == {0: [0.0, 0.0], 2: [0.0, 0.0], 3: [0.0, 0.0]}
    # ... and health sees groups without signal (task 1 scores 1 twice: none either).
    report = check_run(out)
    assert report.failed == ("no_signal_groups",)


async def test_scripted_rows_are_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(task_row(i)) + b"\n" for i in range(3)))
    cfg = stack_config()
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with running_stack() as stack:
            async with asyncio.timeout(60):
                await run_collection(
                    cfg, cfg.collect, tasks, tmp_path / "run", RunningServers(stack.urls),
                    progress=False,
                )  # fmt: skip
    assert not [r for r in caplog.records if "rollgym_script" in r.getMessage()]


def test_only_a_run_whose_every_model_is_scripted_is_checked() -> None:
    assert scripted_models(stack_config()) == ["model"]
    real = stack_data(model={"impl": "openai_proxy", "options": {"upstream": "http://x/v1"}})
    assert scripted_models(parse_config(real, "real")) == []
    given = stack_data(model={"impl": None, "url": "http://127.0.0.1:9"})
    assert scripted_models(parse_config(given, "url")) == []
