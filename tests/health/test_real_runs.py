"""``rollgym health`` on runs collected for real: a bundled config run by ``rollgym run``
passes; the same run with a problem seeded into its files fails the check for it; runs
against the in-process stack whose model answers 500 on some tasks are flagged for it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from rollgym import runtime
from rollgym.collect import RunningServers, run_collection
from rollgym.health import check_run
from tests.health.cli import health_here
from tests.report.runs import aborted_run
from tests.support.cli_here import rollgym_here
from tests.support.servers import FAIL_MARKER
from tests.support.stack import running_stack, stack_config, write_tasks

LOOKUP = Path(__file__).parents[2] / "src" / "rollgym" / "envs" / "lookup" / "config.yaml"


@pytest.fixture(scope="module")
def lookup_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``rollgym run`` of the bundled lookup config (its servers as processes), 6 tasks x 3."""
    out = tmp_path_factory.mktemp("lookup") / "run"
    with pytest.MonkeyPatch.context() as mp:
        # The CLI tunes the garbage collector of the process it owns: not this test session's.
        mp.setattr(runtime, "tune_gc", lambda: None)
        code = rollgym_here(
            "run", LOOKUP, "--output", out, "--limit", "6", "--repeats", "3", "--no-progress"
        )
    assert code == 0
    return out


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("tasks.jsonl", "rollouts.jsonl", "failures.jsonl", "run.json", "metrics.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_a_real_run_of_a_bundled_config_passes(lookup_run: Path) -> None:
    assert health_here(lookup_run) == 0
    saved = orjson.loads((lookup_run / "health.json").read_bytes())
    assert saved["status"] == "completed" and saved["passed"] is True
    assert saved["counts"] == {"rows": 18, "rollouts": 18, "failures": 0}
    judged = {c["id"]: c for c in saved["checks"] if c["outcome"] == "pass"}
    # The checks of a rollout's turns, usage and timing all read the real records.
    for name, of in [("hollow_turns", 18), ("zero_completion_tokens", 18),
                     ("missing_records", 18), ("model_call_retries", 36),
                     ("tasks_always_failing", 6)]:  # fmt: skip
        assert judged[name]["of"] == of, name


def test_a_real_run_with_a_duplicated_row(lookup_run: Path, tmp_path: Path) -> None:
    run = copy_run(lookup_run, tmp_path / "dup")
    lines = (run / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
    (run / "rollouts.jsonl").write_bytes(b"".join([*lines, lines[4]]))
    report = check_run(run)
    assert report.failed == ("duplicate_records",)
    assert report.checks[0].examples[0].line == 19


def test_a_real_run_with_a_ledger_gap_and_a_torn_line(lookup_run: Path, tmp_path: Path) -> None:
    run = copy_run(lookup_run, tmp_path / "gap")
    lines = (run / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
    # The last record lost, half of it written: a run killed mid-write (and not resumed).
    (run / "rollouts.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:50])
    report = check_run(run)
    assert report.failed == ("missing_records",)
    assert any("torn last line" in w for w in report.warnings)
    assert health_here(run) == 1


def test_a_real_run_with_hollow_answers(lookup_run: Path, tmp_path: Path) -> None:
    run = copy_run(lookup_run, tmp_path / "hollow")
    out = []
    for raw in (run / "rollouts.jsonl").read_bytes().splitlines():
        rec = orjson.loads(raw)
        if rec["task_index"] == 1:  # the model "answered" nothing on task 1
            rec["response"]["output"][-1]["content"][0]["text"] = ""
        out.append(orjson.dumps(rec) + b"\n")
    (run / "rollouts.jsonl").write_bytes(b"".join(out))
    report = check_run(run)
    # Every repeat of task 1 is hollow: the task is consistently unhealthy too.
    assert set(report.failed) == {"hollow_turns", "tasks_always_unhealthy"}
    assert report.checks[5].count == 3
    sick = next(c for c in report.checks if c.id == "tasks_always_unhealthy")
    assert [e.task_index for e in sick.examples] == [1]


async def test_a_task_that_always_fails_for_real(tmp_path: Path) -> None:
    """Task 2's rows make the model answer 500 every time: its 3 rollouts are failures."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 8, fail={2})
    out = tmp_path / "run"
    cfg = stack_config({"concurrency": 4, "repeats": 3})
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        async with asyncio.timeout(60):
            await run_collection(
                cfg, cfg.collect, tasks, out, RunningServers(stack.urls), progress=False
            )
    report = check_run(out)
    # ... and the agent retried each of their model calls twice (3 attempts): 6 retries in
    # some 45 model calls. Every other task's 3 rollouts all scored 1: no signal for GRPO.
    assert set(report.failed) == {
        "tasks_always_failing", "failure_rate", "server_retries", "no_signal_groups"
    }  # fmt: skip
    flat = next(c for c in report.checks if c.id == "no_signal_groups")
    assert (flat.count, flat.of) == (7, 7) and flat.detail["by_reward"] == {"1": 7}
    always = next(c for c in report.checks if c.id == "tasks_always_failing")
    assert [e.task_index for e in always.examples] == [2]
    rate = next(c for c in report.checks if c.id == "failure_rate")
    assert (rate.count, rate.of) == (3, 24)
    assert rate.detail["by_server"] == {"model": 3}
    retries = next(c for c in report.checks if c.id == "server_retries")
    assert retries.detail["worst"] == "agent->model" and retries.count == 6


async def test_an_aborted_run_is_flagged_for_its_failures_not_its_gap(tmp_path: Path) -> None:
    out = await aborted_run(tmp_path)
    report = check_run(out)
    assert report.status == "aborted"
    got = {c.id: c for c in report.checks}
    assert got["missing_records"].outcome == "unobserved"
    assert got["missing_records"].detail["pending"] > 0
    assert {"failure_rate", "failure_bursts"} <= set(report.failed)
    assert got["failure_bursts"].detail["worst"]["server"] == "model"
    assert "tasks_always_failing" not in report.failed  # one repeat: nothing to judge
