"""SkyRL's generator on rollgym (``rollgym.integrations.skyrl``).

The unit tests run without SkyRL: SkyRL's inputs read back as rollgym tasks (``plan_batch``,
refusing what is ambiguous), its sampling parameters on the tasks, rollout records to SkyRL's
output (``generator_output``), and the generator's work (``RolloutGenerator``) against a real
rollgym stack on 127.0.0.1 (``skyrl_stack``). Trajectory ids there are a ``NamedTuple`` with
SkyRL's two field names; SkyRL's own classes are used only in the opt-in test.

The opt-in test runs SkyRL itself: skipped unless ``SKYRL_PYTHON`` names a Python that can
import SkyRL's generator types and rollgym (``tests/integrations/skyrl_requirements.txt``)::

    python3.12 -m venv /tmp/skyrl-venv     # here: ~/.pyenv/versions/3.12.1/bin/python3.12
    /tmp/skyrl-venv/bin/pip install -r tests/integrations/skyrl_requirements.txt
    /tmp/skyrl-venv/bin/pip install -e .
    SKYRL_PYTHON=/tmp/skyrl-venv/bin/python .venv/bin/pytest -q tests/integrations/test_skyrl.py

It serves the stack here and runs ``skyrl_generate_check.py`` in ``SKYRL_PYTHON``: SkyRL's
``PromptDataset`` reads ``dataset_row``'s rows, ``prepare_generator_input`` expands them,
the README's entrypoint (``skyrl_entrypoint.py``, a ``BasePPOExp``) builds ``RollgymGenerator``,
which generates; SkyRL's ``validate_generator_output`` accepts the output, and SkyRL's batch
tensors and GRPO advantages are computed from it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from rollgym.collect.records import FailedRollout, RolloutRecord
from rollgym.config import load_config
from rollgym.errors import InputError, InternalError, TokenDataError
from rollgym.integrations.skyrl import (
    TASK_FIELD,
    BatchPlan,
    RolloutGenerator,
    dataset_row,
    generator_output,
    plan_batch,
    with_sampling,
)
from rollgym.server.base import check_servers
from rollgym.trainer import TaskGroup
from tests.integrations.skyrl_stack import skyrl_row, skyrl_rows, skyrl_stack
from tests.integrations.test_samples import call, scored, tool_output
from tests.models.vllm_double import VllmDouble, ids, logprob

HERE = Path(__file__).resolve().parent
SKYRL_PYTHON = os.environ.get("SKYRL_PYTHON", "")
PAD = 0

pytestmark = pytest.mark.timeout(60)


class Tid(NamedTuple):
    instance_id: str
    repetition_id: int


def batch(rows: list[dict[str, Any]], samples: int = 1, **extra: Any) -> dict[str, Any]:
    """A ``GeneratorInput`` as SkyRL's ``prepare_generator_input`` builds it from
    ``dataset_row``'s rows (uid = the row's position)."""
    data = [dataset_row(row, i) for i, row in enumerate(rows)]
    expanded = [(i, d) for i, d in enumerate(data) for _ in range(samples)]
    return {
        "prompts": [d["prompt"] for _, d in expanded],
        "env_classes": [d["env_class"] for _, d in expanded],
        "env_extras": [{TASK_FIELD: d[TASK_FIELD]} for _, d in expanded],
        "sampling_params": None,
        "trajectory_ids": [Tid(str(i), r % samples) for r, (i, _) in enumerate(expanded)],
        "batch_metadata": None,
        **extra,
    }


@pytest.mark.skipif(importlib.util.find_spec("skyrl") is not None, reason="SkyRL is installed here")
def test_without_skyrl_the_module_imports_and_the_generator_says_what_it_needs() -> None:
    import rollgym.integrations.skyrl as module

    assert "skyrl" not in sys.modules
    with pytest.raises(ImportError, match="RollgymGenerator needs SkyRL's generator types"):
        module.RollgymGenerator  # noqa: B018


# -- SkyRL's inputs as rollgym tasks -----------------------------------------------------------


def test_a_batch_reads_back_as_its_tasks_and_rollouts_in_any_order() -> None:
    rows = [skyrl_row("v1"), skyrl_row("v2", params={"input": [{"role": "user", "content": "x"}]})]
    given = batch(rows, samples=2)
    order = [3, 0, 2, 1]
    for key in ("prompts", "env_classes", "env_extras", "trajectory_ids"):
        given[key] = [given[key][i] for i in order]
    plan = plan_batch(given)
    assert plan.repeats == 2
    # Tasks in order of their uid's first appearance: uid "1" (row v2) is input 0.
    assert [t["expected_answer"] for t in plan.tasks] == ["v2", "v1"]
    assert plan.tasks[1] == rows[0]  # the row exactly, every field
    assert plan.slots == [(0, 1), (1, 0), (0, 0), (1, 1)]


def test_a_dataset_row_holds_the_task_as_json_and_its_prompt() -> None:
    row = skyrl_row("v1", options=["a", "b"])
    out = dataset_row(row, 0)
    assert out["prompt"] == [{"role": "user", "content": "please echo v1"}]
    assert out["env_class"] == "rollgym"
    assert json.loads(out[TASK_FIELD]) == row


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(env_extras=None), "one dict per prompt"),
        (lambda b: b.update(trajectory_ids=None), "groups are unknown"),
        (lambda b: b["env_extras"].__setitem__(1, {"other": 1}), "input 1: env_extras has no"),
        (lambda b: b["env_extras"].__setitem__(0, {TASK_FIELD: "{nope"}), "input 0: rollgym_task is not JSON"),
        (lambda b: b["prompts"].__setitem__(2, [{"role": "user", "content": "else"}]), "input 2: the prompt"),
        (lambda b: [b[k].__setitem__(1, b[k][2]) for k in ("prompts", "env_extras")], "input 1: instance_id '0' names two"),
        (lambda b: b["trajectory_ids"].__setitem__(1, Tid("0", 0)), "('0', 0) appears twice"),
        (lambda b: b["trajectory_ids"].__setitem__(3, Tid("1", 5)), "instance_id '1' has repetitions [0, 5]"),
        (lambda b: b["trajectory_ids"].__setitem__(3, Tid("1", -1)), "repetition_id -1"),
        (lambda b: b.update(prompts=[]), "prompts is empty"),
    ],
)  # fmt: skip
def test_an_ambiguous_batch_is_refused_naming_the_input(change: Any, message: str) -> None:
    given = batch([skyrl_row("v1"), skyrl_row("v2")], samples=2)
    change(given)
    with pytest.raises(InputError, match=re.escape(message)):
        plan_batch(given)


def test_a_prompt_read_back_from_a_dataset_file_still_matches() -> None:
    # Arrow fills every message with every key another message has: None is no difference.
    given = batch([skyrl_row("v1")])
    given["prompts"] = [[{"role": "user", "content": "please echo v1", "name": None}]]
    assert plan_batch(given).tasks[0]["expected_answer"] == "v1"


def test_the_trainers_sampling_parameters_win_over_the_rows() -> None:
    # SkyRL's get_vllm_sampling_params(SamplingParams(temperature=0.7)), as it answers.
    skyrl = {
        "min_tokens": 1, "skip_special_tokens": True, "include_stop_str_in_output": True,
        "max_tokens": 64, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "logprobs": 1, "stop": None,
    }  # fmt: skip
    task = skyrl_row("v1", params={"temperature": 0.2, "max_output_tokens": 9})
    params = with_sampling(task, skyrl)["responses_create_params"]
    assert {k: v for k, v in params.items() if k not in ("input", "tools")} == {
        "temperature": 0.7,
        "top_p": 1.0,
        "max_output_tokens": 64,
    }
    params = with_sampling(task, {"top_k": 20, "min_p": 0.1, "stop": ["</a>"]})[
        "responses_create_params"
    ]
    assert (params["top_k"], params["min_p"], params["stop"]) == (20, 0.1, ["</a>"])
    assert with_sampling(task, None) is task


def test_the_readmes_config_for_skyrls_engines_is_a_valid_config() -> None:
    config = load_config(HERE / "skyrl_config.yaml")
    assert config.servers["policy_model"].options["return_token_ids"] is True
    check_servers(config)  # every impl resolves, every option validates, every peer exists


# -- records to SkyRL's output -----------------------------------------------------------------


def two_calls(reward: float) -> RolloutRecord:
    first = call([1, 2, 3], [10, 11])
    second = call([1, 2, 3, 10, 11, 20, 21], [30, 31], kind="message")
    return scored([first, tool_output(), second], reward=reward, num_steps=2)


def failed() -> FailedRollout:
    return FailedRollout(0, 1, InternalError("verifier crashed", status=500, server="env"), 1, 0.1)


def output_of(records: list[list[RolloutRecord]], slots: list[tuple[int, int]]) -> dict[str, Any]:
    groups = [TaskGroup(t, {}, tuple(rs)) for t, rs in enumerate(records)]
    plan = BatchPlan([{}] * len(records), len(records[0]), slots)
    return generator_output(plan, groups, pad_id=PAD)


def test_a_scored_rollout_is_one_row_with_the_fed_tokens_masked() -> None:
    out = output_of([[two_calls(0.5)]], [(0, 0)])
    assert out["prompt_token_ids"] == [[1, 2, 3]]
    assert out["response_ids"] == [[10, 11, 20, 21, 30, 31]]
    assert out["loss_masks"] == [[1, 1, 0, 0, 1, 1]]
    assert out["rollout_logprobs"] == [[-0.5, -0.5, 0.0, 0.0, -0.5, -0.5]]
    assert out["rewards"] == [0.5]
    assert out["stop_reasons"] == ["stop"]
    assert out["env_metrics"] == [
        {"num_steps": 2.0, "rollgym_masked": False, "rollgym_reason": None}
    ]
    assert out["rollout_metrics"] == {
        "rollgym/rollouts": 1.0, "rollgym/trained": 1.0, "rollgym/masked": 0.0,
        "rollgym/reward_mean": 0.5,
    }  # fmt: skip
    assert out["trajectory_ids"] is None


def test_a_masked_row_trains_nothing_and_carries_its_groups_mean() -> None:
    masked = scored([call([1], [2], kind="message")], reward=0.0, mask_sample=True)
    no_tokens = scored([{"type": "message", "content": []}], reward=1.0)
    drift_a = call([1, 2], [3])
    drift_b = call([9, 9, 9], [4], kind="message")  # does not extend [1, 2, 3]
    drifted = scored([drift_a, tool_output(), drift_b], reward=1.0)
    group = [two_calls(1.0), failed(), two_calls(0.0), masked, no_tokens, drifted]
    out = output_of([group], [(0, r) for r in range(6)])
    for i in (1, 3, 4, 5):
        assert out["prompt_token_ids"][i] == [1, 2, 3]  # a trained sibling's prompt
        assert out["response_ids"][i] == [PAD]
        assert out["loss_masks"][i] == [0]
        assert out["rollout_logprobs"][i] == [0.0]
        assert out["rewards"][i] == 0.5  # the mean of the rows that train: 1.0 and 0.0
        assert out["env_metrics"][i]["rollgym_masked"] is True
    assert [out["rewards"][i] for i in (0, 2)] == [1.0, 0.0]
    assert out["stop_reasons"] == [
        "stop", "rollgym_failed", "stop", "rollgym_mask_sample", "rollgym_token_data",
        "rollgym_drifted",
    ]  # fmt: skip
    # The mean over all six rows is the trained rows' mean: GRPO's baseline is theirs.
    assert sum(out["rewards"]) / 6 == 0.5
    metrics = out["rollout_metrics"]
    assert metrics == {
        "rollgym/rollouts": 6.0, "rollgym/trained": 2.0, "rollgym/masked": 4.0,
        "rollgym/failed": 1.0, "rollgym/failed_internal_error": 1.0, "rollgym/mask_sample": 1.0,
        "rollgym/token_data": 1.0, "rollgym/drifted": 1.0,
        # Measured rewards (TaskGroup.rewards: not the failed one, not the masked one).
        "rollgym/reward_mean": 3.0 / 4,
    }  # fmt: skip


def test_a_group_with_nothing_to_train_is_all_placeholders_at_zero() -> None:
    out = output_of(
        [[failed(), failed()], [two_calls(1.0), two_calls(1.0)]], [(0, 0), (1, 0), (0, 1), (1, 1)]
    )
    assert out["rewards"] == [0.0, 1.0, 0.0, 1.0]
    assert out["prompt_token_ids"][0] == [PAD]  # no sibling has a prompt
    assert out["loss_masks"][0] == out["loss_masks"][2] == [0]


def test_rows_come_out_in_input_order() -> None:
    records = [[two_calls(0.1), two_calls(0.2)], [two_calls(0.3), two_calls(0.4)]]
    out = output_of(records, [(1, 1), (0, 0), (1, 0), (0, 1)])
    assert out["rewards"] == [0.4, 0.1, 0.3, 0.2]


def test_a_batch_without_any_token_data_is_an_error_not_a_masked_batch() -> None:
    no_tokens = scored([{"type": "message", "content": []}], reward=1.0)
    with pytest.raises(
        TokenDataError, match=r"no rollout of the batch has token data .* the first: rollout 3:1"
    ):
        output_of([[no_tokens, failed()]], [(0, 0), (0, 1)])


def test_one_bad_token_item_beside_failed_siblings_is_masked_not_a_dead_step() -> None:
    # Token fields are there (the server gives them) but one logprob is not a logprob: that
    # rollout is masked; its failed siblings must not turn it into a batch-wide error.
    bad = scored([{**call([1, 2], [5]), "generation_log_probs": [0.5]}], reward=1.0)
    out = output_of([[bad, failed(), failed(), failed()]], [(0, 0), (0, 1), (0, 2), (0, 3)])
    assert out["loss_masks"] == [[0], [0], [0], [0]]
    assert out["rollout_metrics"]["rollgym/masked"] == 4


def test_a_truncated_last_call_stops_for_length() -> None:
    record = two_calls(1.0)
    record.verified["response"]["status"] = "incomplete"
    record.verified["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    assert output_of([[record]], [(0, 0)])["stop_reasons"] == ["length"]


# -- the generator on a real stack -------------------------------------------------------------


async def test_the_generator_runs_a_batch_on_rollgym() -> None:
    rows = skyrl_rows()
    given = batch(rows, samples=3, sampling_params={"temperature": 0.7, "max_tokens": 64})
    order = list(reversed(range(12)))
    for key in ("prompts", "env_classes", "env_extras", "trajectory_ids"):
        given[key] = [given[key][i] for i in order]
    upstream = VllmDouble()
    async with skyrl_stack(upstream) as agent:
        generator = RolloutGenerator(agent, pad_id=PAD, concurrency=4, rollout_timeout=20)
        try:
            out = await generator.generate(given)
        finally:
            await generator.aclose()
    expected = expected_rows(given["trajectory_ids"])
    check_output(out, expected, [list(t) for t in given["trajectory_ids"]])
    assert {r["temperature"] for r in upstream.requests} == {0.7}
    assert {r["max_tokens"] for r in upstream.requests} == {64}


def expected_rows(tids: list[Any]) -> list[tuple[str, float | None, str | None]]:
    """Per input: its word, its reward (None: masked) and why it is masked."""
    table: dict[str, list[tuple[float | None, str | None]]] = {
        "0": [(1.0, None), (0.0, None), (None, "failed")],
        "1": [(1.0, None), (None, "mask_sample"), (0.5, None)],
        "2": [(None, "failed")] * 3,
        "3": [(1.0, None)] * 3,
    }
    words = {"0": "vA", "1": "vB", "2": "vC", "3": "vD"}
    return [(words[uid], *table[uid][rep]) for uid, rep in ((t[0], t[1]) for t in tids)]


def check_output(out: dict[str, Any], expected: list[Any], tids: list[list[Any]]) -> None:
    """The output is the inputs' rollouts in input order, as the double generated them."""
    placeholder_rewards = {"vA": 0.5, "vB": 0.75, "vC": 0.0}
    n = len(expected)
    for key in ("prompt_token_ids", "response_ids", "loss_masks", "rollout_logprobs", "rewards"):
        assert len(out[key]) == n, key
    assert out["trajectory_ids"] is not None
    assert [list(t) for t in out["trajectory_ids"]] == tids
    for i, (word, reward, reason) in enumerate(expected):
        prompt, response = out["prompt_token_ids"][i], out["response_ids"][i]
        mask, logprobs = out["loss_masks"][i], out["rollout_logprobs"][i]
        assert len(response) == len(mask) == len(logprobs), i
        assert out["env_metrics"][i]["rollgym_reason"] == reason, i
        if reason is None:
            assert out["rewards"][i] == reward
            assert prompt == ids(f"<user>please echo {word}<end><assistant>")
            # call, tool output (fed: mask 0), answer
            gen_call = ids(f'<call>echo {{"text":"{word}"}}</call><end>')
            assert response[: len(gen_call)] == gen_call
            assert mask[: len(gen_call)] == [1] * len(gen_call)
            assert 0 in mask and mask[-1] == 1
            assert all(
                (lp == logprob(t)) if m else (lp == 0.0)
                for t, m, lp in zip(response, mask, logprobs, strict=True)
            )
            assert out["stop_reasons"][i] == "stop"
        else:
            assert (response, mask, logprobs) == ([PAD], [0], [0.0]), i
            assert out["rewards"][i] == placeholder_rewards[word], i
            assert out["stop_reasons"][i] == f"rollgym_{reason}"
            if word != "vC":  # a sibling trained: its prompt
                assert prompt == ids(f"<user>please echo {word}<end><assistant>")
    metrics = out["rollout_metrics"]
    assert metrics["rollgym/rollouts"] == 12.0
    assert metrics["rollgym/trained"] == 7.0
    assert metrics["rollgym/masked"] == 5.0
    assert metrics["rollgym/failed"] == 4.0
    assert metrics["rollgym/mask_sample"] == 1.0
    assert metrics["rollgym/failed_http_status"] == 4.0


# -- SkyRL itself (opt-in) ---------------------------------------------------------------------


@pytest.mark.skipif(not SKYRL_PYTHON, reason="opt-in: set SKYRL_PYTHON (see the module docstring)")
@pytest.mark.timeout(480)
async def test_skyrls_own_pipeline_trains_on_rollgyms_batch(tmp_path: Path) -> None:
    rows_path = tmp_path / "rows.json"
    rows_path.write_text(json.dumps(skyrl_rows()))
    out_path = tmp_path / "out.json"
    async with skyrl_stack(VllmDouble()) as agent:
        proc = await asyncio.create_subprocess_exec(
            SKYRL_PYTHON, str(HERE / "skyrl_generate_check.py"), agent, str(rows_path),
            str(out_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        try:
            stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=420)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    log = stdout.decode(errors="replace")
    sys.stdout.write(log[-4000:])
    assert proc.returncode == 0, log[-4000:]
    out = json.loads(out_path.read_text())
    assert out["trajectory_ids_type"] == ["TrajectoryID"]  # SkyRL's own, handed back
    check_output(out, expected_rows(out["input"]), out["input"])
    assert out["sampling"]["temperature"] == 0.7 and out["sampling"]["max_tokens"] == 64
    # SkyRL's GRPO: a masked row's advantage is 0 and it trains no token; its siblings'
    # advantages are centred on the trained rows' mean.
    for i, (_, _, reason) in enumerate(expected_rows(out["input"])):
        if reason is not None:
            assert out["advantage"][i] == 0.0 and out["trained_tokens"][i] == 0
        else:
            assert out["trained_tokens"][i] == sum(out["loss_masks"][i]) > 0
    by_word: dict[str, list[float]] = {}
    for i, (word, _, reason) in enumerate(expected_rows(out["input"])):
        if reason is None:
            by_word.setdefault(word, []).append(out["advantage"][i])
    assert abs(sum(by_word["vA"])) < 1e-5 and abs(sum(by_word["vB"])) < 1e-5
    assert by_word["vD"] == [0.0, 0.0, 0.0]  # all equal: no signal
    assert min(by_word["vA"]) < 0 < max(by_word["vA"])
    assert out["loss_mask_shape"] == out["logprobs_shape"]
