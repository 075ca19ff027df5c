"""verl's agent loop on rollgym (``rollgym.integrations.verl``).

The unit tests run without verl: the conversion from rollout records to ``AgentLoopOutput``'s
fields (``loop_fields``), the dataset rows, the sampling parameters, and the ``rollgym_grpo``
estimator on torch tensors (torch is in the dev venv; verl is not, and no stand-in for verl's
classes is used here).

The opt-in test runs verl itself: skipped unless ``VERL_PYTHON`` names a Python that can
``import verl`` and ``rollgym`` (``tests/integrations/verl_requirements.txt``)::

    python3.11 -m venv /tmp/verl-venv
    /tmp/verl-venv/bin/pip install -r tests/integrations/verl_requirements.txt -e .
    VERL_PYTHON=/tmp/verl-venv/bin/python .venv/bin/pytest -q tests/integrations/test_verl.py

It serves rollgym's agent, the echo environment and an ``openai_proxy`` with
``return_token_ids`` in front of the vLLM-shaped double here on 127.0.0.1, and runs
``verl_agent_loop_check.py`` in ``VERL_PYTHON``: verl's own ``AgentLoopWorker`` (from verl's
default ``ppo_trainer`` config, ``agent_loop_config_path`` = ``verl_agent_loop.yaml``), verl's
``RLHFDataset`` reading ``dataset_row``'s parquet rows, then verl's union and
``compute_advantage``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.errors import HTTPStatusError, InputError, TransportError
from rollgym.integrations.verl import (
    AGENT_NAME,
    dataset_row,
    loop_fields,
    masked_grpo,
    task_row,
    with_sampling,
)
from rollgym.trainer import RolloutClient
from tests.integrations.test_samples import call, scored, tool_output
from tests.models.test_training_tokens import agent_stack, row
from tests.models.vllm_double import VllmDouble, logprob

HERE = Path(__file__).resolve().parent
VERL_PYTHON = os.environ.get("VERL_PYTHON", "")

pytestmark = pytest.mark.timeout(60)

PAD = 1


def fields(record: Any, **options: Any) -> Any:
    return loop_fields(
        record, pad_id=PAD, prompt_length=options.pop("prompt_length", 64),
        response_length=options.pop("response_length", 64), **options,
    )  # fmt: skip


# -- the conversion ----------------------------------------------------------------------------


def test_a_scored_rollout_is_its_sample_with_the_fed_tokens_masked() -> None:
    first = call([1, 2, 3], [10, 11])
    second = call([1, 2, 3, 10, 11, 20, 21], [30, 31, 32], kind="message")
    out = fields(scored([first, tool_output(), second], reward=0.5, num_steps=2))
    assert out.prompt_ids == [1, 2, 3]
    assert out.response_ids == [10, 11, 20, 21, 30, 31, 32]
    assert out.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert out.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert (out.reward_score, out.reward, out.masked, out.reason) == (0.5, 0.5, False, None)
    assert out.num_turns == 4  # the user's turn, two model calls, one tool output
    assert out.metrics == {"num_steps": 2.0}
    extra = out.extra_fields()
    assert extra["rollgym_masked"] is False and extra["rollgym_error"] is None
    assert extra["reward_extra_info"] == {
        "rollgym/masked": 0.0,
        "rollgym/failed": 0.0,
        "rollgym/truncated": 0.0,
    }


def test_a_response_past_response_length_is_cut_as_verls_own_loops_cut_it() -> None:
    out = fields(scored([call([1, 2], list(range(10, 20)), kind="message")]), response_length=4)
    assert out.response_ids == [10, 11, 12, 13]
    assert len(out.response_mask) == len(out.response_logprobs) == 4
    assert out.truncated and not out.masked
    assert out.extra_fields()["reward_extra_info"]["rollgym/truncated"] == 1.0


def masked_shape(out: Any) -> None:
    assert out.masked
    assert (out.prompt_ids, out.response_ids, out.response_mask) == ([PAD], [PAD], [0])
    assert out.response_logprobs == [0.0]
    # A number, so verl's reward loop does not score it again; no measurement (reward None).
    assert out.reward_score == 0.0 and out.reward is None
    assert out.extra_fields()["rollgym_masked"] is True
    assert out.extra_fields()["reward_extra_info"]["rollgym/masked"] == 1.0


def test_a_failed_rollout_is_masked_with_its_typed_error() -> None:
    error = TransportError("model down", server="model")
    out = fields(FailedRollout(2, 1, error, 1, 0.3))
    masked_shape(out)
    assert out.reason == "failed" and out.error == error
    extra = out.extra_fields()
    assert extra["rollgym_error"]["type"] == "transport_error"
    assert extra["rollgym_error"]["server"] == "model"
    assert extra["reward_extra_info"]["rollgym/failed"] == 1.0
    json.dumps(extra)  # plain data: it travels in verl's numpy object arrays and dumps


def test_a_verifier_masked_rollout_is_masked_and_keeps_its_metrics() -> None:
    out = fields(scored([call([1], [2], kind="message")], mask_sample=True, steps=3))
    masked_shape(out)
    assert out.reason == "masked_by_verifier" and out.error is None
    assert out.metrics == {"steps": 3.0}


@pytest.mark.parametrize(
    "output",
    [
        [{"type": "message", "content": []}],  # no token data at all
        [{**call([1], [2]), "generation_log_probs": [float("nan")]}],  # adversarial logprob
        [{**call([1], [2, 3]), "generation_log_probs": [-0.1]}],  # one logprob short
        [{**call([1], [2]), "generation_token_ids": [-5]}],  # not a token id
        [call([1], [2]), tool_output(), {"type": "message", "content": []}],  # a call uncovered
    ],
)
def test_missing_or_malformed_token_data_is_masked_not_guessed(output: list[Any]) -> None:
    out = fields(scored(output))
    masked_shape(out)
    assert out.reason == "token_data"
    assert out.extra_fields()["rollgym_error"]["type"] == "token_data"


def test_drift_masks_the_rollout_or_keeps_its_first_run_of_calls() -> None:
    first = call([1, 2], [10])
    second = call([1, 2, 99, 20], [30], kind="message")  # does not extend [1, 2, 10]
    record = scored([first, tool_output(), second])
    out = fields(record)
    masked_shape(out)
    assert out.reason == "drift"
    kept = fields(record, on_drift="first")
    assert (kept.prompt_ids, kept.response_ids, kept.response_mask) == ([1, 2], [10], [1])
    assert kept.reward == 1.0 and not kept.masked


def test_an_id_past_the_vocabulary_or_a_reward_that_is_no_number_is_masked() -> None:
    record = scored([call([1, 2], [3, 999], kind="message")])
    assert not fields(record).masked  # no vocabulary given: not checked
    out = fields(record, vocab_size=999)
    masked_shape(out)
    assert out.reason == "token_data" and "past the tokenizer's 999 ids" in str(out.error)
    assert not fields(record, vocab_size=1000).masked
    for reward in (float("nan"), float("inf")):
        out = fields(scored([call([1], [2], kind="message")], reward=reward))
        masked_shape(out)
        assert out.reason == "reward_not_finite"


def test_a_prompt_past_prompt_length_is_masked_not_cut() -> None:
    out = fields(scored([call(list(range(1, 11)), [2], kind="message")]), prompt_length=4)
    masked_shape(out)
    assert out.reason == "prompt_too_long"


def test_lengths_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        fields(scored([call([1], [2])]), response_length=0)


# -- dataset rows and sampling -----------------------------------------------------------------


def test_a_dataset_row_carries_the_task_and_gives_it_back() -> None:
    task = row()
    verl_row = dataset_row(task, 7)
    assert verl_row["prompt"] == [{"role": "user", "content": "please echo v7"}]
    assert verl_row["agent_name"] == AGENT_NAME
    assert verl_row["extra_info"] == {"index": 7}
    assert task_row(verl_row) == task
    assert task_row({"extra_info": {"rollgym_task": task}}) == task
    listed = {"responses_create_params": {"input": [
        {"role": "system", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]}}  # fmt: skip
    assert dataset_row(listed, 0)["prompt"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize("bad", [{}, {"rollgym_task": "{not json"}, {"rollgym_task": 3}])
def test_a_row_without_a_task_says_what_it_needs(bad: dict[str, Any]) -> None:
    with pytest.raises(InputError, match="rollgym_task"):
        task_row(bad)


def test_dataset_row_refuses_a_task_without_input() -> None:
    with pytest.raises(InputError, match="responses_create_params"):
        dataset_row({"expected_answer": "x"}, 0)
    with pytest.raises(InputError, match="neither text nor a list"):
        dataset_row({"responses_create_params": {"input": 3}}, 0)


def test_verls_sampling_parameters_win_and_its_off_values_are_left_out() -> None:
    task = row()  # temperature 0.6 in the row
    sampled = with_sampling(task, {"temperature": 1.0, "top_p": 0.9, "top_k": -1, "logprobs": 1})
    params = sampled["responses_create_params"]
    assert (params["temperature"], params["top_p"]) == (1.0, 0.9)
    assert "top_k" not in params and "logprobs" not in params
    assert with_sampling(task, {"top_k": 20})["responses_create_params"]["top_k"] == 20
    assert task["responses_create_params"]["temperature"] == 0.6  # the row is not changed


# -- the estimator -----------------------------------------------------------------------------


def test_rollgym_grpo_leaves_masked_rows_out_of_the_baseline() -> None:
    torch = pytest.importorskip("torch")
    rewards = torch.zeros(5, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    mask = torch.ones(5, 3)
    mask[2] = 0  # masked: reward 0.0 placeholder
    index = ["a", "a", "a", "b", "b"]
    adv, returns = masked_grpo(rewards, mask, index, config={"norm_adv_by_std_in_grpo": True})
    std = torch.tensor([1.0, 0.0]).std()
    assert torch.allclose(adv[0], torch.full((3,), 0.5 / (std.item() + 1e-6)))
    assert torch.allclose(adv[1], torch.full((3,), -0.5 / (std.item() + 1e-6)))
    assert torch.equal(adv[2], torch.zeros(3))  # nothing to learn from a masked row
    assert torch.allclose(adv[3], -adv[4])
    assert adv is returns
    plain, _ = masked_grpo(rewards, mask, index, config={"norm_adv_by_std_in_grpo": False})
    assert torch.allclose(plain[0], torch.full((3,), 0.5))
    alone, _ = masked_grpo(rewards[:3], mask[:3], ["a", "b", "b"])  # group b: one trains
    assert torch.allclose(alone[0], torch.ones(3)) and torch.allclose(alone[1], torch.zeros(3))
    # One scored row whose siblings all failed has no baseline: advantage 0, not the
    # group-of-one rule's 1.0 (which would let failures change the gradient).
    survivor = torch.zeros(4, 3)
    survivor[0, -1] = 1.0
    masks = torch.zeros(4, 3)
    masks[0] = 1
    lone, _ = masked_grpo(survivor, masks, ["a"] * 4)
    assert torch.equal(lone, torch.zeros(4, 3))


# -- verl itself (opt-in) ----------------------------------------------------------------------


def failing_row() -> dict[str, Any]:
    """A row the model server refuses (422: ``background`` has no chat counterpart): the
    rollout fails, typed, without a retry."""
    task = row()
    task["responses_create_params"] = {**task["responses_create_params"], "background": True}
    return task


@pytest.mark.skipif(not VERL_PYTHON, reason="opt-in: set VERL_PYTHON (see the docstring)")
@pytest.mark.timeout(600)
async def test_verls_agent_loop_worker_runs_rollgym_rollouts(tmp_path: Path) -> None:
    upstream, drifting = VllmDouble(), VllmDouble()
    drifting.drift = True
    wrong = row()
    wrong["expected_answer"] = "v8"  # the same conversation, scored 0.0
    tasks, drift_tasks = tmp_path / "tasks.jsonl", tmp_path / "drift.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in [row(), wrong, failing_row()]))
    drift_tasks.write_text(json.dumps(row()) + "\n")
    async with agent_stack(upstream) as agent_url, agent_stack(drifting) as drift_url:
        env = {**os.environ, "ROLLGYM_AGENT_URL": agent_url, "RAY_DISABLE_IMPORT_WARNING": "1"}
        proc = await asyncio.create_subprocess_exec(
            VERL_PYTHON, str(HERE / "verl_agent_loop_check.py"), str(tmp_path), str(tasks),
            str(drift_tasks), drift_url, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 540)  # verl's import is slow
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()[-4000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    rows = result["rows"]
    assert len(rows) == 6  # 3 rows x rollout.n = 2, in verl's order
    assert result["shapes"]["prompts"] == [6, 64] and result["shapes"]["responses"] == [6, 256]

    # A scored rollout: the ids the model saw and made, exactly, through verl's padding.
    # The four scored rollouts are one conversation (the double is deterministic): two calls.
    calls = {
        (tuple(p), tuple(g)) for p, g in zip(upstream.prompts, upstream.generated, strict=True)
    }
    (p0, g0), (p1, g1) = sorted(calls, key=lambda c: len(c[0]))
    assert len(upstream.prompts) == 8
    ok = rows[0]
    assert ok["prompt_ids"] == list(p0)
    assert ok["prompt_ids"] + ok["response_ids"] == list(p1 + g1)
    made = [t for t, m in zip(ok["response_ids"], ok["response_mask"], strict=True) if m]
    assert made == list(g0 + g1)
    assert 0 in ok["response_mask"]  # the tool result between the calls is fed, not trained
    assert ok["padded_mask_sum"] == len(made)  # padding is 0 in verl's response_mask
    assert [lp for lp, m in zip(ok["logprobs"], ok["response_mask"], strict=True) if m] == [
        pytest.approx(logprob(t), abs=1e-6) for t in made
    ]
    # verl put the loop's reward on the last response token (its reward loop was not asked).
    assert ok["rm_score"] == 1.0 == ok["reward"]
    assert ok["rm_score_at"] == len(ok["response_ids"]) - 1
    assert not ok["masked"] and ok["num_turns"] == 4
    assert rows[1]["response_ids"] == ok["response_ids"]  # the row's second rollout
    assert [r["rm_score"] for r in rows[2:4]] == [0.0, 0.0]
    assert not rows[2]["masked"] and rows[2]["reward"] == 0.0  # scored 0.0: a measurement

    # A failed rollout: masked, typed, one pad id each side, nothing trained.
    for failed in rows[4:]:
        assert failed["masked"] and failed["reason"] == "failed"
        assert failed["error_type"] == "http_status"
        assert failed["prompt_ids"] == [1] and failed["response_ids"] == [1]
        assert failed["padded_mask_sum"] == 0 and failed["reward"] is None
    assert set(result["reward_extra_keys"]) == {
        "rollgym/masked",
        "rollgym/failed",
        "rollgym/truncated",
    }
    counts = result["rollgym_counts"]
    assert counts["rollgym/masked"] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert counts["rollgym/failed"] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]

    # All six in one group: rollgym_grpo's baseline is the four scored (mean 0.5), verl's GRPO
    # counts the two masked 0.0s too (mean 1/3).
    std = (1 / 3) ** 0.5  # of [1, 1, 0, 0], with Bessel's correction as torch.std
    assert result["rollgym_grpo"][:4] == pytest.approx([0.5 / std] * 2 + [-0.5 / std] * 2, 1e-3)
    assert result["rollgym_grpo"][4:] == [0.0, 0.0]
    assert result["grpo"][0] > result["rollgym_grpo"][0]  # the masked 0.0s lowered the baseline
    assert result["rollgym_grpo_by_row"] == [0.0] * 6  # each row's repeats agree

    # Drift (the template re-rendered the model's tool call): masked, not trained on.
    assert [(r["masked"], r["reason"]) for r in result["drift"]] == [(True, "drift")] * 2
    assert len(drifting.prompts) == 4  # two rollouts, two calls each: they did run


async def test_the_failing_row_fails_typed_through_rollgym() -> None:
    """The opt-in test's failing row, checked where it is cheap: a 4xx, so not retried."""
    async with agent_stack(VllmDouble()) as url, RolloutClient(url) as client:
        record = await client.run(failing_row(), 0, 0, rollout_timeout=20)
    assert isinstance(record, FailedRollout)
    assert isinstance(record.error, HTTPStatusError)
    assert isinstance(fields(record).error, HTTPStatusError)
    assert not isinstance(record, ScoredRollout)


def test_the_agent_url_comes_from_the_config_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollgym.errors import ConfigError
    from rollgym.integrations.verl import AGENT_URL_ENV, _agent_urls

    assert _agent_urls(["http://a:1", "http://b:2"]) == ["http://a:1", "http://b:2"]
    monkeypatch.setenv(AGENT_URL_ENV, " http://a:1, http://b:2 ,")
    assert _agent_urls(None) == ["http://a:1", "http://b:2"]
    monkeypatch.setenv(AGENT_URL_ENV, "")
    with pytest.raises(ConfigError, match=AGENT_URL_ENV):
        _agent_urls(None)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("verl") is not None, reason="verl is installed here"
)
def test_without_verl_the_agent_loop_says_what_it_needs() -> None:
    import rollgym.integrations.verl as module

    with pytest.raises(ImportError, match=r"needs verl \(pip install verl==0.9.1\)"):
        _ = module.RollgymAgentLoop
    with pytest.raises(AttributeError):
        _ = module.nothing_here
