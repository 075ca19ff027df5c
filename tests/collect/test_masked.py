"""``mask_sample`` (NeMo Gym 0.7): a verify response whose reward is no measurement.

A real run against an environment that masks some rollouts: they are recorded in
``rollouts.jsonl`` with the flag, left out of the reward mean/std, pass@k and the environment's
aggregate, counted in ``metrics.json``'s coverage, the progress counters and ``rollgym report``,
and the trainer API keeps them out of a group's rewards. A ``mask_sample`` that is no boolean
fails its rollout as a ``ProtocolError``; so does NeMo RL's ``instance_config.mask_sample`` said
without the top-level flag in a plain run (rollgym reads the top only; NeMo Gym 0.7's rows lift
it there: ``rollgym.nemo_gym.rows``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import EXIT_SOME_FAILED, Collector, prepare_run
from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.errors import InvalidRequest, ProtocolError
from rollgym.nemo_gym.mask import INSTANCE_CONFIG, is_masked, lifted, mask_sample
from rollgym.protocol import check_verified
from rollgym.protocol import mask_sample as core_mask_sample
from rollgym.report import load_run
from rollgym.report.summary import headline
from rollgym.server.aggregate import aggregate, measured
from rollgym.server.resources import Session
from rollgym.trainer import RolloutClient
from rollgym.wire import MASK_SAMPLE
from tests.support.ledger import assert_ledger_invariant, read_jsonl
from tests.support.servers import CountingEcho
from tests.support.stack import running_stack, stack_config, task_row

pytestmark = pytest.mark.timeout(120)

NG07_PYTHON = Path(__file__).resolve().parents[2] / ".interop07-venv" / "bin" / "python"


class MaskingEcho(CountingEcho):
    """Echo, whose verify masks as the row's ``mask_as`` says (``top``: ``mask_sample``;
    ``rl``: NeMo RL's ``instance_config.mask_sample``; ``bad``: a string; ``false``: an explicit
    false), for the rollouts in ``mask_rollouts`` (default: all). Its masked reward is a
    placeholder 0, as 0.7's ``judge_failsafe`` writes it."""

    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        reward = await super().verify(session, task, response)
        how = task.get("mask_as")
        which = task.get("mask_rollouts")
        if how is None or (which is not None and task["rollout_index"] not in which):
            return reward
        if how == "false":
            return {"reward": reward, MASK_SAMPLE: False}
        if how == "rl":
            return {"reward": 0.0, INSTANCE_CONFIG: {MASK_SAMPLE: True}}
        return {"reward": 0.0, MASK_SAMPLE: "yes" if how == "bad" else True}

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rows_seen": len(rollouts)}


def _rows() -> list[dict[str, Any]]:
    return [
        task_row(0),  # measured: 1, 1
        {**task_row(1), "mask_as": "top"},  # both masked: a fully masked task
        {**task_row(2), "mask_as": "rl", "mask_rollouts": [1]},  # 1, a flag not read: fails
        {**task_row(3, say="I do not know"), "mask_as": "false"},  # measured: 0, 0
        {**task_row(4), "mask_as": "bad"},  # no boolean: both fail
    ]


async def test_a_run_records_masked_rollouts_and_measures_only_the_others(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _rows()))
    out = tmp_path / "out"
    async with running_stack(env=MaskingEcho) as stack:
        cfg = stack_config({"concurrency": 4, "repeats": 2})
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
        collector = Collector(prepared, stack.urls, progress=False)
        async with asyncio.timeout(60):
            outcome = await collector.execute()
    assert outcome.exit_code == EXIT_SOME_FAILED  # task 4's rollouts and (2, 1) failed

    rollouts, failures = assert_ledger_invariant(out)
    masked = sorted((r["task_index"], r["rollout_index"]) for r in rollouts if r.get(MASK_SAMPLE))
    assert masked == [(1, 0), (1, 1)]
    assert all(
        r[MASK_SAMPLE] is True and r["reward"] == 0.0 for r in rollouts if r.get(MASK_SAMPLE)
    )
    assert sorted((f["task_index"], f["rollout_index"]) for f in failures) == [
        (2, 1), (4, 0), (4, 1),
    ]  # fmt: skip
    for line in failures:
        assert line["error"]["type"] == "protocol_error"
        message = line["error"]["message"]
        if line["task_index"] == 4:
            assert "mask_sample" in message and '"yes"' in message
        else:  # NeMo RL's flag alone is not dropped in silence: the rollout is no measurement
            assert "instance_config.mask_sample true" in message

    m = orjson.loads((out / "metrics.json").read_bytes())
    assert m["counts"] == {"total": 10, "succeeded": 7, "failed": 3, "pending": 0}
    assert m["coverage"] == {
        "measured_rollouts": 5, "masked_rollouts": 2, "measured_tasks": 3,
        "fully_masked_tasks": 1,
    }  # fmt: skip
    # Measured: task 0 (1, 1), task 2 (1), task 3 (0, 0); the masked zeros are no rewards.
    assert m["reward"]["mean"] == pytest.approx(3 / 5)
    assert m["pass_at_k"] == pytest.approx({"pass@1": 2 / 3, "pass@2": 0.5})
    per_task = {t["task_index"]: t for t in read_jsonl(out / "per_task.jsonl")}
    assert (per_task[1]["scored"], per_task[1]["masked"], per_task[1]["pass_rate"]) == (0, 2, None)
    assert (per_task[2]["scored"], per_task[2]["masked"]) == (1, 0)
    assert collector.progress.masked == 2 and collector.progress.failed == 3

    # The environment's aggregate, in NeMo Gym's shape: masked rows out, 0.7's coverage in.
    agg = m["env_aggregate"]
    for section in (agg["agent_metrics"], agg["key_metrics"]):
        assert section["coverage/masked_rollouts"] == 2
        assert section["coverage/measured_rollouts"] == 5
        assert section["coverage/fully_masked_tasks"] == 1
    assert agg["agent_metrics"]["mean/reward"] == pytest.approx(3 / 5)
    assert not any("mask_sample" in key for key in agg["agent_metrics"])
    (written,) = orjson.loads((out / "rollouts_aggregate_metrics.json").read_bytes())
    assert [g["_ng_task_index"] for g in written["group_level_metrics"]] == [0, 2, 3]

    run = load_run(out)
    assert (run.scored, run.masked, len(run.failures), run.pending) == (5, 2, 3, 0)
    assert run.reward_mean() == pytest.approx(3 / 5)
    assert headline(run)["rollouts"] == "5 ok, 2 masked, 3 failed, 0 pending of 10"
    assert run.tasks[1].pass_rate is None and run.tasks[1].masked == 2


async def test_the_trainer_never_sees_a_masked_reward() -> None:
    async with running_stack(env=MaskingEcho) as stack, RolloutClient(stack.agent_url) as client:
        groups = await client.collect(_rows(), repeats=2, budget=None)
        single = await client.run(_rows()[4])
    plain, fully, half, wrong, bad = groups
    assert plain.rewards == [1.0, 1.0] and plain.complete and not plain.masked
    assert fully.rewards == [] and fully.scored == [] and len(fully.masked) == 2
    assert not fully.complete
    assert all(isinstance(r, ScoredRollout) and r.masked for r in fully.masked)
    assert half.rewards == [1.0] and not half.masked
    assert [r.rollout_index for r in half.failed] == [1]
    assert wrong.rewards == [0.0, 0.0] and wrong.complete  # an explicit false is measured
    assert len(bad.failed) == 2 and bad.rewards == [] and not bad.masked
    assert all(isinstance(r.error, ProtocolError) for r in bad.failed)
    assert isinstance(single, FailedRollout) and isinstance(single.error, ProtocolError)


def test_the_flag_is_read_where_0_7_and_nemo_rl_put_it() -> None:
    assert mask_sample({}) is None and not is_masked({})
    assert mask_sample({MASK_SAMPLE: False}) is False
    assert mask_sample({MASK_SAMPLE: True}) is True
    assert mask_sample({INSTANCE_CONFIG: {MASK_SAMPLE: True}}) is True
    assert is_masked({MASK_SAMPLE: False, INSTANCE_CONFIG: {MASK_SAMPLE: True}})  # either one
    for bad in ("true", 1, 0.0, [], {"x": 1}):
        with pytest.raises(ProtocolError):
            mask_sample({MASK_SAMPLE: bad}, server="env")
        assert not is_masked({MASK_SAMPLE: bad})
    with pytest.raises(ProtocolError):
        mask_sample({INSTANCE_CONFIG: {MASK_SAMPLE: "yes"}})


def test_the_core_reads_the_top_and_drops_no_flag_it_does_not_read() -> None:
    """rollgym's own reading: the top-level flag; one nested that the top does not say is a
    typed failure, never a reward; a 0.7 row's response is lifted first."""
    assert core_mask_sample({MASK_SAMPLE: True, INSTANCE_CONFIG: {MASK_SAMPLE: True}}) is True
    assert core_mask_sample({INSTANCE_CONFIG: {MASK_SAMPLE: False}}) is None
    for said in ({INSTANCE_CONFIG: {MASK_SAMPLE: True}},
                 {MASK_SAMPLE: False, INSTANCE_CONFIG: {MASK_SAMPLE: True}},
                 {INSTANCE_CONFIG: {MASK_SAMPLE: "yes"}}):  # fmt: skip
        with pytest.raises(ProtocolError, match=r"instance_config\.mask_sample"):
            check_verified({"reward": 0.0, **said}, "agent")
    nemo_rl = {"reward": 0.0, INSTANCE_CONFIG: {MASK_SAMPLE: True}}
    assert check_verified(lifted(nemo_rl), "agent")[MASK_SAMPLE] is True
    assert lifted({"reward": 1.0}) == {"reward": 1.0}


# -- /aggregate_metrics --------------------------------------------------------------------------


def _sheet_rows() -> list[dict[str, Any]]:
    """The fact sheet's example: rewards [1, 0, 1, 1, 0], rows 1 and 3 masked."""
    usage = {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    return [
        {"_ng_task_index": i, "_ng_rollout_index": 0, "reward": float(r),
         MASK_SAMPLE: i in (1, 3), "response": {"usage": usage}}
        for i, r in enumerate([1, 0, 1, 1, 0])
    ]  # fmt: skip


def test_the_aggregate_leaves_masked_rows_out_as_0_7_does() -> None:
    got = aggregate(_sheet_rows(), {})
    coverage = {
        "coverage/measured_rollouts": 3, "coverage/masked_rollouts": 2,
        "coverage/measured_tasks": 3, "coverage/fully_masked_tasks": 2,
    }  # fmt: skip
    agent = got.agent_metrics
    assert agent["mean/reward"] == pytest.approx(0.6667, abs=1e-4)  # unmasked it would be 0.6
    assert (agent["max/reward"], agent["min/reward"], agent["median/reward"]) == (1, 0, 1)
    assert agent["std/reward"] == pytest.approx(0.5774, abs=1e-4)
    assert {k: agent[k] for k in coverage} == coverage
    assert set(got.key_metrics) == {
        "mean/reward", "mean/input_tokens", "mean/output_tokens", "mean/total_tokens", *coverage,
    }  # fmt: skip
    assert [g["_ng_task_index"] for g in got.group_level_metrics] == [0, 2, 4]
    assert not any("mask" in k for k in agent if not k.startswith("coverage/"))
    # Nothing masked: the answer of before, no coverage keys.
    plain = aggregate([{**r, MASK_SAMPLE: False} for r in _sheet_rows()], {})
    assert plain.key_metrics["mean/reward"] == pytest.approx(0.6)
    assert not any(k.startswith("coverage/") for k in plain.agent_metrics)
    # Everything masked: the coverage keys only.
    every = aggregate([{**r, MASK_SAMPLE: True} for r in _sheet_rows()], {"hit_rate": 1.0})
    assert every.agent_metrics == every.key_metrics == {
        "coverage/measured_rollouts": 0, "coverage/masked_rollouts": 5,
        "coverage/measured_tasks": 0, "coverage/fully_masked_tasks": 5,
    }  # fmt: skip
    assert every.group_level_metrics == []
    assert [r["_ng_task_index"] for r in measured(_sheet_rows())] == [0, 2, 4]
    with pytest.raises(InvalidRequest) as info:
        aggregate([{**_sheet_rows()[0], MASK_SAMPLE: "no"}], {})
    assert info.value.status == 422 and "verify_responses[0]" in info.value.message


_NG07_AGGREGATE = """
import json, sys
from nemo_gym.reward_profile import compute_aggregate_metrics
print(json.dumps([compute_aggregate_metrics(rows).model_dump() for rows in json.load(sys.stdin)]))
"""


@pytest.mark.skipif(not NG07_PYTHON.exists(), reason="no NeMo Gym 0.7 interop venv here")
def test_the_aggregate_matches_0_7s_side_by_side() -> None:
    cases = [
        _sheet_rows(),
        [{**r, MASK_SAMPLE: False} for r in _sheet_rows()],
        [{**r, "_ng_task_index": i // 2, "_ng_rollout_index": i % 2} for i, r in
         enumerate(_sheet_rows() + _sheet_rows()[:1])],
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [str(NG07_PYTHON), "-c", _NG07_AGGREGATE], input=orjson.dumps(cases),
        capture_output=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    for rows, theirs in zip(cases, orjson.loads(done.stdout), strict=True):
        ours = aggregate(rows, {}).model_dump()
        # 0.7 adds num_repeats and, with repeats, its *_across_repeats statistics (rollgym's
        # 0.4 shape has neither); every other key is the same, masked or not.
        extra = {
            k for k in theirs["agent_metrics"] if k == "num_repeats" or "_across_repeats/" in k
        }
        their_agent = {k: v for k, v in theirs["agent_metrics"].items() if k not in extra}
        assert ours["agent_metrics"] == pytest.approx(their_agent)
        assert ours["key_metrics"] == pytest.approx(
            {k: v for k, v in theirs["key_metrics"].items() if k not in extra}
        )
        assert [g["_ng_task_index"] for g in ours["group_level_metrics"]] == [
            g["_ng_task_index"] for g in theirs["group_level_metrics"]
        ]
