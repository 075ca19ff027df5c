"""``rollgym reverify``: a run's recorded rollouts scored again by the config's verifier, through
the path of every run (its ledger, metrics, resume), and exactly the changed rewards reported."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from rollgym.collect import EXIT_ABORTED
from rollgym.reverify import reverify
from tests.report.runs import aborted_run, good_run
from tests.report.servers import changed
from tests.support.ledger import assert_ledger_invariant, keys, read_jsonl
from tests.support.stack import stack_config

pytestmark = pytest.mark.timeout(120)

STRICTER = {"impl": "tests.report.servers:StricterEcho"}


def _rows(out: Path) -> dict[tuple[int, int], dict[str, object]]:
    return {(r["task_index"], r["rollout_index"]): r for r in read_jsonl(out / "tasks.jsonl")}


def test_a_changed_verifier_changes_exactly_the_rewards_it_should(tmp_path: Path) -> None:
    source = asyncio.run(good_run(tmp_path))
    before = {(r["task_index"], r["rollout_index"]): r["reward"]
              for r in read_jsonl(source / "rollouts.jsonl")}  # fmt: skip
    rows = _rows(source)
    expected = {k for k, reward in before.items() if reward == 1.0 and changed(rows[k])}
    assert expected and len(expected) < len(before)

    cfg = stack_config({"concurrency": 4}, env=STRICTER)
    out = tmp_path / "reverified"
    outcome, diff = asyncio.run(reverify(cfg, cfg.collect, source, out, progress=False))

    assert outcome.status == "completed"
    assert {(c.task_index, c.rollout_index) for c in diff.changed} == expected
    assert all(c.before == 1.0 and c.after == 0.0 for c in diff.changed)
    assert diff.compared == len(before)
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == [] and _rows(out) == rows
    after = {(r["task_index"], r["rollout_index"]): r["reward"] for r in rollouts}
    assert after == {k: 0.0 if k in expected else v for k, v in before.items()}
    # The session was seeded and the recorded tool calls replayed before /verify.
    assert all(len(r["rollgym_timing"]["tool"]) == 1 for r in rollouts)
    saved = orjson.loads((out / "reverify_diff.json").read_bytes())
    assert saved["changed"] == len(expected)
    assert sum(len(v) for v in saved["by_task"].values()) == len(expected)
    assert saved["metrics_after"]["reward_mean"] < saved["metrics_before"]["reward_mean"]
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["reward"]["mean"] == pytest.approx(saved["metrics_after"]["reward_mean"])

    # Resumed, a finished reverify redoes nothing; the same verifier as the run changes nothing.
    outcome, diff = asyncio.run(
        reverify(cfg, cfg.collect, source, out, resume=True, progress=False)
    )
    assert outcome.status == "completed" and len(read_jsonl(out / "rollouts.jsonl")) == 48
    same = stack_config({"concurrency": 4})
    _, diff = asyncio.run(reverify(same, same.collect, source, tmp_path / "same", progress=False))
    assert diff.changed == [] and diff.compared == 48


def test_an_aborted_run_is_reverified_as_far_as_it_went(tmp_path: Path) -> None:
    source = asyncio.run(aborted_run(tmp_path))
    failed = read_jsonl(source / "failures.jsonl")
    scored = read_jsonl(source / "rollouts.jsonl")
    cfg = stack_config({"concurrency": 4, "min_failure_samples": 20})
    out = tmp_path / "reverified"
    outcome, diff = asyncio.run(reverify(cfg, cfg.collect, source, out, progress=False))

    # Its failures are copied, not counted against this run's failure budget (they are most of
    # it); what it never recorded stays pending, and the run says why.
    assert outcome.exit_code == EXIT_ABORTED
    assert outcome.abort_reason is not None and "no record in" in outcome.abort_reason
    rollouts, failures = read_jsonl(out / "rollouts.jsonl"), read_jsonl(out / "failures.jsonl")
    assert sorted(keys(failures)) == sorted(keys(failed))
    assert [
        f["error"] for f in sorted(failures, key=lambda f: (f["task_index"], f["rollout_index"]))
    ] == [f["error"] for f in sorted(failed, key=lambda f: (f["task_index"], f["rollout_index"]))]
    assert sorted(keys(rollouts)) == sorted(keys(scored)) and diff.changed == []
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted"


def test_a_config_with_agents_in_process_is_reverified_without_an_agent(tmp_path: Path) -> None:
    source = asyncio.run(good_run(tmp_path, n=4, repeats=2))
    cfg = stack_config({"concurrency": 4, "agent_in_process": True})
    out = tmp_path / "reverified"
    outcome, diff = asyncio.run(reverify(cfg, cfg.collect, source, out, progress=False))
    assert outcome.status == "completed" and diff.changed == [] and diff.compared == 8
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["collect"]["agent_in_process"] is False  # no agent ran, here or elsewhere
