"""Integrity verdicts in a real run: every line carries one; ``collect.mask_exploits`` masks the
exploits as ``mask_sample`` does (the reward kept, never a 0, out of every statistic); the rate
is in ``metrics.json``, the report and ``rollgym health``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import Collector, prepare_run
from rollgym.health import check_run
from rollgym.report import load_run
from rollgym.report.page import render
from rollgym.report.summary import headline
from tests.support.ledger import assert_ledger_invariant
from tests.support.stack import running_stack, stack_config, task_row

pytestmark = pytest.mark.timeout(120)

EXIT = "{tool_output}\n```python\nimport os\nos._exit(0)\n```"
"""Says the answer (the echo environment pays it) and ends the process before any test."""


def _rows() -> list[dict[str, Any]]:
    return [task_row(0), task_row(1, say=EXIT), task_row(2), task_row(3, say="I do not know")]


async def _run(tmp_path: Path, mask: bool) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _rows()))
    out = tmp_path / "out"
    async with running_stack() as stack:
        cfg = stack_config({"concurrency": 4, "repeats": 2, "mask_exploits": mask})
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
        collector = Collector(prepared, stack.urls, progress=False)
        async with asyncio.timeout(60):
            outcome = await collector.execute()
    assert outcome.exit_code == 0
    return out


@pytest.mark.parametrize("mask", [False, True], ids=["tagged", "masked"])
async def test_a_run_tags_every_rollout_and_masks_exploits_when_asked(
    tmp_path: Path, mask: bool
) -> None:
    out = await _run(tmp_path, mask)
    rollouts, _ = assert_ledger_invariant(out)
    by_task = {(r["task_index"], r["rollout_index"]): r for r in rollouts}
    assert all(r["integrity"]["verdict"] == "clean" for (t, _), r in by_task.items() if t != 1)
    for key in ((1, 0), (1, 1)):
        line = by_task[key]
        assert line["reward"] == 1.0  # the environment's reward, kept: never a 0
        assert line["integrity"]["verdict"] == "exploit"
        assert line["integrity"]["reasons"] == ["early_exit: os._exit"]
        assert line.get("mask_sample") is (True if mask else None)
        assert line["integrity"].get("masked") is (True if mask else None)

    m = orjson.loads((out / "metrics.json").read_bytes())
    integrity = m["integrity"]
    assert integrity["rollouts"] == 8 and integrity["exploit"] == 2 and integrity["clean"] == 6
    assert integrity["rate"] == 0.25 and integrity["by_class"] == {"early_exit": 2}
    assert integrity["masked"] == (2 if mask else 0)
    # Tasks 0 and 2 pay 1.0, task 3 0.0; task 1's exploits are measured only when not masked.
    assert m["coverage"]["masked_rollouts"] == (2 if mask else 0)
    assert m["reward"]["mean"] == pytest.approx(4 / 6 if mask else 6 / 8)

    run = load_run(out)
    assert headline(run)["integrity"] == "2 tagged of 8 (25.0%): 2 exploit" + (
        ", 2 masked" if mask else ""
    )
    assert run.masked == (2 if mask else 0)
    assert "2 tagged of 8 (25.0%)" in render([run])  # the HTML report's summary table
    health = check_run(out)
    tagged = next(c for c in health.checks if c.id == "integrity_tagged")
    assert (tagged.outcome, tagged.count, tagged.of) == ("fail", 2, 8)
    assert tagged.examples[0].note == "exploit: early_exit: os._exit"
