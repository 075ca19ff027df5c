"""The one token path: rollout records -> trainer samples (``rollgym.integrations.samples``).

Synthetic records pin the rules (masks, drift, missing data, failures); one test runs a real
multi-turn rollout (rollgym's agent, ``openai_proxy`` with ``return_token_ids``, the echo
environment, the vLLM-shaped double upstream) and checks that the sample is the conversation's
ids exactly as the model saw and produced them.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.errors import RollgymError, TokenDataError, TransportError
from rollgym.integrations.samples import (
    Sample,
    group_samples,
    placeholder,
    rollout_calls,
    rollout_samples,
)
from tests.models.test_training_tokens import agent_stack, row, run
from tests.models.vllm_double import END, GEN_PROMPT, VllmDouble, ids, logprob

pytestmark = pytest.mark.timeout(60)


def call(prompt: list[int], gen: list[int], kind: str = "function_call") -> dict[str, Any]:
    return {
        "type": kind,
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": [-0.5] * len(gen),
    }


def tool_output() -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "c", "output": "x"}


def scored(output: list[dict[str, Any]], reward: float = 1.0, **fields: Any) -> ScoredRollout:
    verified = {"reward": reward, "response": {"output": output}, **fields}
    return ScoredRollout(3, 1, reward, 1, 0.1, verified)


def test_two_calls_join_with_the_fed_tokens_masked() -> None:
    first = call([1, 2, 3], [10, 11])
    second = call([1, 2, 3, 10, 11, 20, 21], [30, 31, 32], kind="message")
    [sample] = rollout_samples(scored([first, tool_output(), second], num_steps=2))
    assert sample.prompt_ids == [1, 2, 3]
    assert sample.completion_ids == [10, 11, 20, 21, 30, 31, 32]
    assert sample.mask == [1, 1, 0, 0, 1, 1, 1]
    assert sample.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert (sample.reward, sample.masked, sample.calls, sample.segment) == (1.0, False, 2, 0)
    assert sample.generated_tokens == 5
    assert sample.metrics == {"num_steps": 2.0}
    assert (sample.task_index, sample.rollout_index) == (3, 1)


def test_drift_cuts_the_rollout_or_is_an_error() -> None:
    first = call([1, 2], [5])
    drifted = call([1, 2, 6, 7], [8], kind="message")  # 6 is not the 5 the model generated
    record = scored([first, tool_output(), drifted], reward=0.5)
    cut = rollout_samples(record)
    assert [(s.segment, s.prompt_ids, s.completion_ids, s.reward) for s in cut] == [
        (0, [1, 2], [5], 0.5),
        (1, [1, 2, 6, 7], [8], 0.5),
    ]
    with pytest.raises(TokenDataError, match="output item 2's prompt does not begin"):
        rollout_samples(record, on_drift="error")


@pytest.mark.parametrize(
    ("output", "problem"),
    [
        ([], "no response.output"),
        ([{"type": "message", "content": []}], "output item 0 was produced by a model call"),
        (
            [call([1], [2]), tool_output(), {"type": "message"}],
            "output item 2 was produced by a model call that carries no token data",
        ),
        (
            [{"type": "reasoning"}, tool_output(), call([1], [2], kind="message")],
            "output item 0 was produced",
        ),
        ([tool_output()], "no model call carries token data"),
        ([{**call([1], [2]), "generation_log_probs": [-1.0, -1.0]}], "1 generated ids but 2"),
        ([{**call([1], [2]), "generation_log_probs": [float("nan")]}], "a logprob is nan"),
        ([{**call([1], [2]), "generation_log_probs": [3.0]}], "a logprob is 3.0"),
        ([{**call([1], [2]), "generation_log_probs": [True]}], "a logprob is True"),
        ([{**call([1], [2]), "generation_token_ids": [-4]}], "generation_token_ids are not"),
        ([{**call([1], [2]), "prompt_token_ids": []}], "prompt_token_ids are not"),
        ([{**call([1], [2]), "prompt_token_ids": ["1"]}], "prompt_token_ids are not"),
        ([{"type": "message", "prompt_token_ids": [1]}], "lacks generation_token_ids"),
        (["a string"], "output item 0 is not an object"),
        ([call([1], [])], r"output items 0\) generated no token"),
    ],
)
def test_missing_or_malformed_token_data_is_a_typed_error(output: list[Any], problem: str) -> None:
    with pytest.raises(TokenDataError, match=problem) as caught:
        rollout_samples(scored(output))
    assert "rollout 3:1" in caught.value.message
    assert caught.value.type == "token_data"
    # The error is a record like every rollgym error: it survives pickling and JSON.
    assert pickle.loads(pickle.dumps(caught.value)).message == caught.value.message
    assert RollgymError.from_dict(caught.value.to_dict()).type == "token_data"


def test_failed_and_masked_rollouts_are_masked_samples_without_a_reward() -> None:
    error = TransportError("model down", server="model")
    failed = FailedRollout(0, 2, error, 3, 1.0)
    masked = scored([call([1], [2])], reward=0.0, mask_sample=True)
    [f] = rollout_samples(failed)
    [m] = rollout_samples(masked)
    for sample in (f, m):
        assert sample.masked and sample.reward is None
        assert sample.completion_ids == [] and sample.mask == []
    assert f.failure is error and m.failure is None
    shaped = placeholder(f, [4, 5], pad_id=0)
    assert shaped.prompt_ids == [4, 5] and shaped.completion_ids == [0] and shaped.mask == [0]
    assert shaped.masked and shaped.reward is None
    assert placeholder(f, [], pad_id=7).prompt_ids == [7]
    with pytest.raises(ValueError, match="masked samples only"):
        placeholder(rollout_samples(scored([call([1], [2])]))[0], [1], pad_id=0)


def test_group_samples_keep_the_records_order() -> None:
    records = [scored([call([1], [2])]), FailedRollout(3, 2, TransportError("x"), 1, 0.0)]
    samples = group_samples(records)
    assert [(s.rollout_index, s.masked) for s in samples] == [(1, False), (2, True)]
    assert all(isinstance(s, Sample) for s in samples)


async def test_a_real_multi_turn_rollout_is_the_conversation_the_model_saw() -> None:
    upstream = VllmDouble()
    upstream.tool_turns = 2
    async with agent_stack(upstream) as agent:
        verified = await run(agent, row())
    record = ScoredRollout(0, 0, verified["reward"], 1, 0.1, verified)
    calls = rollout_calls(record)
    assert len(calls) == 3 == len(upstream.prompts)
    [sample] = rollout_samples(record)
    assert sample.prompt_ids == upstream.prompts[0]
    assert sample.prompt_ids == ids(f"<user>please echo v7{END}{GEN_PROMPT}")
    # The last call's prompt is everything before its generation: the whole sequence is that
    # prompt and generation, and the model's tokens are exactly the generated ones.
    full = sample.prompt_ids + sample.completion_ids
    assert full == upstream.prompts[-1] + upstream.generated[-1]
    made = [t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m]
    assert made == [t for gen in upstream.generated for t in gen]
    fed = [t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if not m]
    assert fed and all(
        lp == 0.0 for lp, m in zip(sample.logprobs, sample.mask, strict=True) if not m
    )
    assert [lp for lp, m in zip(sample.logprobs, sample.mask, strict=True) if m] == [
        logprob(t) for t in made
    ]
    assert sample.reward == 1.0

    # With drift (the template re-serialises the model's tool-call JSON) it is cut per call.
    drifting = VllmDouble()
    drifting.tool_turns = 2
    drifting.drift = True
    async with agent_stack(drifting) as agent:
        verified = await run(agent, row())
    record = ScoredRollout(0, 0, verified["reward"], 1, 0.1, verified)
    assert [s.segment for s in rollout_samples(record)] == [0, 1, 2]
    with pytest.raises(TokenDataError, match="re-tokenization drift"):
        rollout_samples(record, on_drift="error")


def test_each_calls_policy_version_is_on_the_sample() -> None:
    first = {**call([1, 2], [3]), "rollgym_policy_version": 4}
    second = {**call([1, 2, 3, 9], [5], kind="message"), "rollgym_policy_version": 5}
    [sample] = rollout_samples(scored([first, tool_output(), second]))
    assert sample.policy_versions == (4, 5)
    [old] = rollout_samples(scored([call([1], [2])]))
    assert old.policy_versions == (None,)
    with pytest.raises(TokenDataError, match="rollgym_policy_version is '4'"):
        rollout_samples(scored([{**call([1], [2]), "rollgym_policy_version": "4"}]))


def test_the_proxy_reads_the_policy_version_off_the_upstreams_completion() -> None:
    from rollgym.errors import ProtocolError
    from rollgym.models.tokens import call_tokens

    content = [{"token": "token_id:7", "logprob": -0.25}]
    completion: dict[str, Any] = {
        "prompt_token_ids": [1, 2],
        "choices": [{"token_ids": [7], "logprobs": {"content": content}}],
        "rollgym_policy_version": 3,
    }
    tokens = call_tokens(completion, upstream="model")
    assert tokens.policy_version == 3
    assert tokens.as_fields()["rollgym_policy_version"] == 3
    del completion["rollgym_policy_version"]
    assert "rollgym_policy_version" not in call_tokens(completion, upstream="m").as_fields()
    completion["rollgym_policy_version"] = True
    with pytest.raises(ProtocolError, match="not an integer"):
        call_tokens(completion, upstream="model")
