"""The collector against an in-process model + env + agent stack on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import (
    EXIT_ABORTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    Collector,
    RunOutcome,
    prepare_run,
)
from rollgym.errors import ConfigError
from tests.support.ledger import assert_ledger_invariant, error_chain, keys, read_jsonl
from tests.support.servers import FAIL_MARKER, FAULT_MESSAGE
from tests.support.stack import Stack, running_stack, stack_config, write_tasks

pytestmark = pytest.mark.timeout(60)


async def collect(
    stack: Stack, tasks: Path, out: Path, *, resume: bool = False, **collect: Any
) -> RunOutcome:
    cfg = stack_config({"concurrency": 4, **collect})
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=resume)
    async with asyncio.timeout(30):
        return await Collector(prepared, stack.urls, progress=False).execute()


async def test_rollouts_failing_500_are_recorded_and_the_rest_complete(tmp_path: Path) -> None:
    failing = {2, 5, 7}
    tasks = write_tasks(tmp_path / "tasks.jsonl", 10, fail=failing)
    out = tmp_path / "out"
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        outcome = await collect(stack, tasks, out, repeats=2)

        assert outcome.exit_code == EXIT_SOME_FAILED
        assert outcome.status == "completed_with_failures"
        rollouts, failures = assert_ledger_invariant(out)
        assert sorted({t for t, _ in keys(failures)}) == sorted(failing)
        assert len(failures) == 6 and len(rollouts) == 14
        assert all(r["reward"] == 1.0 for r in rollouts)
        for rec in failures:
            assert rec["attempts"] == 1  # one rollout attempt, in which the model was retried
            chain = error_chain(rec["error"])
            assert chain[0]["server"] == "agent" and chain[0]["status"] == 502
            model_error = next(e for e in chain if e["server"] == "model")
            assert model_error["status"] == 500
            assert model_error["attempts"] == 3
            assert model_error["endpoint"] == "/v1/responses"
            assert FAULT_MESSAGE in model_error["message"]
        assert stack.model.faults == 6 * 3
        assert stack.env.calls["verify"] == 14  # a failed rollout is never scored

        metrics = orjson.loads((out / "metrics.json").read_bytes())
        assert metrics["counts"] == {"total": 20, "succeeded": 14, "failed": 6, "pending": 0}
        assert metrics["failures"]["by_server"] == {"model": 6}
        assert metrics["failures"]["by_status"] == {"500": 6}
        assert metrics["reward"]["mean"] == 1.0  # failures are not rewards of 0
        run = orjson.loads((out / "run.json").read_bytes())
        assert run["status"] == "completed_with_failures" and run["exit_code"] == 1

        # The model is fixed: --resume redoes exactly the failed rollouts, never a success.
        stack.model.options.fail_marker = None
        before = (out / "rollouts.jsonl").read_bytes()
        calls_before = stack.model.requests
        outcome = await collect(stack, tasks, out, repeats=2, resume=True)
        assert outcome.exit_code == EXIT_OK and outcome.status == "completed"
        assert stack.model.requests - calls_before == 6 * 2  # two model turns per rollout
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == []
    assert (out / "rollouts.jsonl").read_bytes().startswith(before)
    redone = [r for r in rollouts if r["task_index"] in failing]
    assert len(redone) == 6 and all(r["attempts"] == 2 for r in redone)
    assert len(read_jsonl(out / "failures.history.jsonl")) == 6


async def test_failures_out_of_attempts_are_final_on_resume(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 4, fail={1})
    out = tmp_path / "out"
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        first = await collect(stack, tasks, out, max_rollout_attempts=1)
        stack.model.options.fail_marker = None
        calls = stack.model.requests
        again = await collect(stack, tasks, out, max_rollout_attempts=1, resume=True)
        assert stack.model.requests == calls  # nothing left to try
    assert first.exit_code == again.exit_code == EXIT_SOME_FAILED
    _, failures = assert_ledger_invariant(out)
    assert keys(failures) == [(1, 0)]


async def test_a_404_on_the_first_rollouts_aborts_at_once(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    out = tmp_path / "out"
    # The agent's "model" points at the env server, which has no /v1/responses.
    async with running_stack(model_as="env") as stack:
        outcome = await collect(stack, tasks, out, concurrency=4)
        seeded = stack.env.calls["seed_session"]
    assert outcome.exit_code == EXIT_ABORTED and outcome.status == "aborted"
    assert outcome.abort_reason is not None
    assert "configuration error" in outcome.abort_reason and "404" in outcome.abort_reason
    failures = read_jsonl(out / "failures.jsonl")
    assert len(failures) == 1  # the first one stopped the run; the rest stay pending
    assert read_jsonl(out / "rollouts.jsonl") == []
    assert seeded <= 4  # only the rollouts already in flight ever started
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted"
    assert run["abort"]["by_status"] == {"404": 1}
    assert run["abort"]["by_server"] == {"model": 1}


async def test_a_torn_last_line_is_repaired_on_resume(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 6)
    out = tmp_path / "out"
    async with running_stack() as stack:
        assert (await collect(stack, tasks, out)).exit_code == EXIT_OK
        lines = (out / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
        torn_key = keys([orjson.loads(lines[-1])])[0]
        # A kill in the middle of writing the last record:
        (out / "rollouts.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:40])
        calls = stack.model.requests
        outcome = await collect(stack, tasks, out, resume=True)
        assert stack.model.requests - calls == 2  # only the torn rollout was redone
    assert outcome.exit_code == EXIT_OK
    rollouts, _ = assert_ledger_invariant(out)
    assert keys(rollouts)[-1] == torn_key
    assert (out / "rollouts.jsonl").read_bytes().startswith(b"".join(lines[:-1]))


async def test_resume_refuses_other_inputs_and_a_used_directory_needs_resume(
    tmp_path: Path,
) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    other = write_tasks(tmp_path / "other.jsonl", 4)
    out = tmp_path / "out"
    async with running_stack() as stack:
        await collect(stack, tasks, out, repeats=2)
    cfg = stack_config({"repeats": 3})
    with pytest.raises(ConfigError, match=r"cannot resume: --repeats differs .*\(2 then, 3 now\)"):
        prepare_run(cfg, cfg.collect, tasks, out, resume=True)
    cfg = stack_config({"repeats": 2})
    with pytest.raises(ConfigError, match=r"cannot resume: the input file's content differs"):
        prepare_run(cfg, cfg.collect, other, out, resume=True)
    with pytest.raises(ConfigError, match=r"holds an earlier run .*pass --resume"):
        prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    with pytest.raises(ConfigError, match="nothing to resume"):
        prepare_run(cfg, cfg.collect, tasks, tmp_path / "empty", resume=True)


def test_a_run_killed_before_its_first_record_still_needs_resume(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    cfg = stack_config()
    prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)  # then killed
    with pytest.raises(ConfigError, match=r"holds an earlier run \(run.json, tasks.jsonl\)"):
        prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
