"""The TRL bridge on synthetic records (``rollgym.integrations.trl``): which row each TRL prompt
names (stamps, duplicate texts, refusals), what ``RolloutFunc`` returns for TRL (ids, masks,
one sample per prompt in TRL's order), failures, verifier masks, missing token data and drift
as masked samples that reward functions see as None, the per-step counts, and ``WeightSync``.
The real ``GRPOTrainer`` runs in ``test_trl_grpo.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout
from rollgym.errors import HTTPStatusError, InputError
from rollgym.integrations.trl import (
    TASK_KEY,
    RolloutFunc,
    TaskTable,
    WeightSyncCallback,
    metric_reward,
    rollgym_reward,
)
from rollgym.trainer import RolloutClient, TaskGroup

pytestmark = pytest.mark.timeout(60)

PAD = 0


def row(text: str, **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **fields}


def call(prompt: list[int], gen: list[int], kind: str = "message") -> dict[str, Any]:
    return {
        "type": kind,
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": [-0.25] * len(gen),
    }


def scored(t: int, r: int, output: list[dict[str, Any]], reward: float, **fields: Any) -> Any:
    verified = {"reward": reward, "response": {"output": output}, **fields}
    return ScoredRollout(t, r, reward, 1, 0.1, verified)


def failed(t: int, r: int) -> FailedRollout:
    error = HTTPStatusError("model answered 500", status=500, server="model")
    return FailedRollout(t, r, error, 1, 0.1)


Maker = Callable[[int, int, dict[str, Any]], RolloutRecord]


class FakeClient(RolloutClient):
    """Answers ``collect_sync`` with records made by ``make(task, rollout, row)``; remembers
    each call's rows and repeats."""

    def __init__(self, make: Maker) -> None:
        super().__init__("http://127.0.0.1:9")
        self.make = make
        self.calls: list[tuple[list[dict[str, Any]], int]] = []

    def collect_sync(self, rows: Iterable[dict[str, Any]], **options: Any) -> list[TaskGroup]:
        rows = list(rows)
        repeats = options["repeats"]
        self.calls.append((rows, repeats))
        return [
            TaskGroup(t, r, tuple(self.make(t, i, r) for i in range(repeats)))
            for t, r in enumerate(rows)
        ]


def trainer(step: int = 0, temperature: float = 1.0) -> Any:
    return SimpleNamespace(
        processing_class=SimpleNamespace(pad_token_id=PAD),
        args=SimpleNamespace(temperature=temperature),
        state=SimpleNamespace(global_step=step),
    )


def good(t: int, r: int, row_: dict[str, Any]) -> RolloutRecord:
    """A one-call rollout: prompt [1, 2, 3 + row tag], generation [10 + r, 2]."""
    tag = row_.get("tag", 0)
    return scored(t, r, [call([1, 2, 3 + tag], [10 + r, 2])], reward=float(r), accuracy=0.5)


# -- which row a prompt names -------------------------------------------------------------------


def test_rows_with_the_same_text_get_prompts_that_tell_them_apart() -> None:
    table = TaskTable([row("same", tag=1), row("same", tag=2), row("other")])
    dataset = table.dataset()
    assert len(dataset) == 3
    prompts = [dataset[i]["prompt"] for i in range(3)]
    # Arrow gives every message every field (None where unset): still exactly one stamp.
    assert prompts[0][-1]["content"] == "same" and prompts[0][-1][TASK_KEY].startswith("0:")
    assert [table.index_of(p) for p in prompts] == [0, 1, 2]


def test_an_unstamped_prompt_is_matched_only_when_its_text_names_one_row() -> None:
    table = TaskTable([row("same", tag=1), row("same", tag=2), row("other")])
    assert table.index_of("other") == 2
    assert table.index_of([{"role": "user", "content": "other"}]) == 2
    with pytest.raises(ValueError, match=r"rows \[0, 1\].*ambiguous"):
        table.index_of("same")
    with pytest.raises(ValueError, match="no row of this table"):
        table.index_of("never seen")


def test_a_stamp_of_another_table_or_a_forged_one_is_refused() -> None:
    mine, theirs = TaskTable([row("a"), row("b")]), TaskTable([row("x"), row("b")])
    with pytest.raises(ValueError, match="digest differs"):
        mine.index_of(theirs.prompt(0))
    forged = [{"role": "user", "content": "a", TASK_KEY: "7:abc"}]
    with pytest.raises(ValueError, match="names no row"):
        mine.index_of(forged)
    twice = [{"role": "user", "content": "a", TASK_KEY: mine.prompt(0)[-1][TASK_KEY]}] * 2
    with pytest.raises(ValueError, match="2 rollgym_task stamps"):
        mine.index_of(twice)
    with pytest.raises(ValueError, match="not a string"):
        mine.index_of([{"role": "user", "content": "a", TASK_KEY: 0}])
    with pytest.raises(ValueError, match="string or a list of messages"):
        mine.index_of(42)


def test_input_forms_become_text_messages_and_a_row_without_input_is_refused() -> None:
    parts = {"role": "user", "content": [{"type": "input_text", "text": "he"}, {"text": "llo"}]}
    table = TaskTable(
        [
            {"responses_create_params": {"input": "plain"}},
            {"responses_create_params": {"input": [{"role": "system", "content": "s"}, parts]}},
        ]
    )
    assert table.prompt(0)[0] == {
        "role": "user",
        "content": "plain",
        TASK_KEY: table.prompt(0)[0][TASK_KEY],
    }
    assert [m["content"] for m in table.prompt(1)] == ["s", "hello"]
    with pytest.raises(InputError, match=r"task 0: .* has no message"):
        TaskTable([{"responses_create_params": {"input": []}}])


# -- what the rollout function returns ----------------------------------------------------------


def test_repeated_prompts_are_collected_as_groups_and_come_back_in_trl_order() -> None:
    table = TaskTable([row("same", tag=1), row("same", tag=2)])
    client = FakeClient(good)
    func = RolloutFunc(client, table)
    prompts = [table.prompt(1)] * 3 + [table.prompt(0)] * 3  # as TRL repeats them
    out = func(prompts, trainer())
    [(rows, repeats)] = client.calls
    assert repeats == 3 and [r["tag"] for r in rows] == [2, 1]
    assert out["prompt_ids"] == [[1, 2, 5]] * 3 + [[1, 2, 4]] * 3
    assert out["completion_ids"] == [[10, 2], [11, 2], [12, 2]] * 2
    assert out["env_mask"] == [[1, 1]] * 6
    assert out["logprobs"] == [[-0.25, -0.25]] * 6
    assert out["rollgym_reward"] == [0.0, 1.0, 2.0] * 2
    assert out["rollgym_masked"] == [False] * 6
    assert func.reports[-1].scored == 6 and func.reports[-1].masked == 0


def test_a_multi_turn_rollout_masks_the_tokens_it_was_fed() -> None:
    def two_calls(t: int, r: int, _: dict[str, Any]) -> RolloutRecord:
        first = call([1, 2], [10, 11], kind="function_call")
        fed = {"type": "function_call_output", "call_id": "c", "output": "x"}
        return scored(t, r, [first, fed, call([1, 2, 10, 11, 20], [30])], reward=1.0)

    table = TaskTable([row("q")])
    out = RolloutFunc(FakeClient(two_calls), table)([table.prompt(0)] * 2, trainer())
    assert out["completion_ids"] == [[10, 11, 20, 30]] * 2
    assert out["env_mask"] == [[1, 1, 0, 1]] * 2
    assert out["logprobs"] == [[-0.25, -0.25, 0.0, -0.25]] * 2


def test_a_failure_is_a_masked_sample_with_no_reward_and_no_loss() -> None:
    def second_fails(t: int, r: int, row_: dict[str, Any]) -> RolloutRecord:
        return failed(t, r) if r == 1 else good(t, r, row_)

    table = TaskTable([row("q", tag=1)])
    func = RolloutFunc(FakeClient(second_fails), table)
    out = func([table.prompt(0)] * 3, trainer(step=4))
    # The placeholder: the group's prompt ids, one pad token, env_mask 0: it trains on nothing.
    assert out["prompt_ids"][1] == [1, 2, 4]
    assert (out["completion_ids"][1], out["env_mask"][1], out["logprobs"][1]) == ([PAD], [0], [0.0])
    assert out["rollgym_reward"] == [0.0, None, 2.0]  # None, never 0
    assert out["rollgym_masked"] == [False, True, False]
    assert out["rollgym_failure"][1] == "HTTPStatusError: model answered 500"
    report = func.reports[-1]
    assert (report.step, report.rollouts, report.scored, report.masked, report.failed) == (
        4,
        3,
        2,
        1,
        1,
    )
    assert report.failure_types == {"HTTPStatusError": 1}
    assert "1 failed: 1 HTTPStatusError" in report.line()


def test_a_group_that_failed_entirely_gets_one_pad_token_prompts() -> None:
    table = TaskTable([row("q")])
    func = RolloutFunc(FakeClient(lambda t, r, _: failed(t, r)), table, pad_token_id=7)
    out = func([table.prompt(0)] * 2, trainer())
    assert out["prompt_ids"] == [[7], [7]] and out["completion_ids"] == [[7], [7]]
    assert out["env_mask"] == [[0], [0]] and out["rollgym_reward"] == [None, None]


def test_verifier_masks_missing_token_data_and_drift_are_masked_and_counted() -> None:
    def kinds(t: int, r: int, row_: dict[str, Any]) -> RolloutRecord:
        if r == 0:  # the verifier says its reward is no measurement
            return scored(t, r, [call([1], [2])], reward=0.0, mask_sample=True)
        if r == 1:  # no token data at all (a proxy without return_token_ids)
            return scored(t, r, [{"type": "message", "content": []}], reward=1.0)
        if r == 2:  # the second call's prompt does not extend the first: drift
            return scored(t, r, [call([1, 2], [3]), call([9, 9, 9, 9], [4])], reward=1.0)
        return good(t, r, row_)

    table = TaskTable([row("q")])
    func = RolloutFunc(FakeClient(kinds), table)
    out = func([table.prompt(0)] * 4, trainer())
    assert out["rollgym_masked"] == [True, True, True, False]
    assert out["rollgym_reward"] == [None, None, None, 3.0]
    assert all(m == [0] for m in out["env_mask"][:3])
    assert out["rollgym_failure"][0] == "masked by the verifier"
    assert out["rollgym_failure"][1].startswith("TokenDataError:")
    assert "drift cut it into 2 segments" in out["rollgym_failure"][2]
    report = func.reports[-1]
    assert (report.verifier_masked, report.token_errors, report.drifted, report.failed) == (
        1,
        1,
        1,
        0,
    )
    assert report.masked == 3 and report.scored == 1


def test_prompts_of_several_lengths_are_still_one_group_each() -> None:
    table = TaskTable([row("a"), row("b")])
    client = FakeClient(good)
    out = RolloutFunc(client, table)([table.prompt(0)] * 2 + [table.prompt(1)] * 3, trainer())
    assert sorted(repeats for _, repeats in client.calls) == [2, 3]
    assert len(out["prompt_ids"]) == 5
    assert out["rollgym_reward"] == [0.0, 1.0, 0.0, 1.0, 2.0]


def test_sampling_is_laid_over_every_row_and_a_temperature_mismatch_is_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = TaskTable([row("a")])
    client = FakeClient(good)
    RolloutFunc(client, table, sampling={"temperature": 0.7})([table.prompt(0)], trainer())
    assert client.calls[0][0][0]["responses_create_params"]["temperature"] == 0.7
    assert "GRPOConfig.temperature is 1.0" in caplog.text
    assert table.rows[0]["responses_create_params"].get("temperature") is None  # not mutated


def test_repeats_cannot_be_passed_it_comes_from_trl() -> None:
    with pytest.raises(ValueError, match="num_generations"):
        RolloutFunc(FakeClient(good), TaskTable([row("a")]), repeats=4)  # type: ignore[call-arg]


def test_the_policy_version_of_each_rollout_is_reported_where_the_server_names_it() -> None:
    def versioned(t: int, r: int, row_: dict[str, Any]) -> RolloutRecord:
        if r == 2:
            return failed(t, r)
        first = {**call([1, 2], [3], kind="function_call"), "rollgym_policy_version": 3 + r}
        fed = {"type": "function_call_output", "call_id": "c", "output": "x"}
        second = {**call([1, 2, 3, 4], [5]), "rollgym_policy_version": 4 + r}
        return scored(t, r, [first, fed, second], reward=1.0)

    table = TaskTable([row("q")])
    func = RolloutFunc(FakeClient(versioned), table)
    out = func([table.prompt(0)] * 3, trainer())
    assert out["rollgym_policy_version"] == [3, 4, None]
    assert func.reports[-1].policy_versions == (3, 4)
    assert "policy versions [3, 4]" in func.reports[-1].line()


# -- reward functions ---------------------------------------------------------------------------


def test_reward_functions_give_none_for_masked_samples_and_log_the_counts() -> None:
    logged: dict[str, float] = {}
    rewards = rollgym_reward(
        rollgym_reward=[1.0, None, None],
        rollgym_masked=[False, True, True],
        rollgym_failure=[None, "HTTPStatusError: x", "masked by the verifier"],
        log_metric=logged.__setitem__,
        prompts=["p"] * 3,
    )
    assert rewards == [1.0, None, None]
    assert logged == {"rollgym/masked": 2.0, "rollgym/failed": 1.0}
    accuracy = metric_reward("accuracy")
    assert accuracy.__name__ == "rollgym_accuracy"
    metrics = [{"accuracy": 0.5}, {"accuracy": 0.9}, {}]
    assert accuracy(rollgym_metrics=metrics, rollgym_masked=[False, True, False]) == [
        0.5,
        None,
        None,
    ]


# -- weight sync --------------------------------------------------------------------------------


class Saver:
    def save_pretrained(self, path: Path) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "model.safetensors").write_text("w")


def test_weight_sync_pushes_each_step_as_its_version_and_keeps_the_newest(tmp_path: Path) -> None:
    pushed: list[tuple[Path, int]] = []

    class Target:
        def push_sync(self, path: str | Path, version: int) -> dict[str, int]:
            assert (Path(path) / "model.safetensors").exists()  # saved before the push
            pushed.append((Path(path), version))
            return {"version": version}

    sync = WeightSyncCallback(Target(), tmp_path, keep=2, at_start=True)  # type: ignore[arg-type]
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    sync.on_train_begin(None, state, None, model=Saver())
    for step in (1, 2, 3):
        state.global_step = step
        sync.on_step_end(None, state, None, model=Saver())
    assert [v for _, v in pushed] == [0, 1, 2, 3]
    assert sync.versions[-1] == (3, {"version": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]
    with pytest.raises(ValueError, match="no model"):
        sync.on_step_end(None, state, None)
    # By default the server is taken to serve the trainer's starting weights as version 0.
    quiet = WeightSyncCallback(Target(), tmp_path / "b")  # type: ignore[arg-type]
    quiet.on_train_begin(None, SimpleNamespace(global_step=0, is_world_process_zero=True), None)
    assert quiet.versions == []
