"""Training token data through ``openai_proxy`` (``return_token_ids: true``) from a vLLM-shaped
upstream (``vllm_double``), served for real: each model call's last output item carries that
call's prompt ids, generated ids and logprobs; multi-turn drift is counted on the rollout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from rollgym.collect.metrics import compute_metrics
from rollgym.errors import ProtocolError
from rollgym.http import Target
from rollgym.models.tokens import CallTokens, call_tokens, drifted_turns
from rollgym.testing import serve_asgi, serve_server
from tests.support.stack import ECHO_TOOL, fast_policy

from .shapes import check_response
from .vllm_double import END, GEN_PROMPT, VllmDouble, ids, logprob

pytestmark = pytest.mark.timeout(30)

TRAINING = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@asynccontextmanager
async def proxy_in_front(upstream: VllmDouble, **options: Any) -> AsyncIterator[str]:
    async with serve_asgi(upstream.app) as up_url:
        opts = {"base_url": up_url + "/v1", "return_token_ids": True, "model": "toy", **options}
        async with serve_server("openai_proxy", name="model", options=opts) as (url, _):
            yield url


@asynccontextmanager
async def agent_stack(upstream: VllmDouble, **options: Any) -> AsyncIterator[str]:
    async with (
        proxy_in_front(upstream, **options) as model_url,
        serve_server("echo", name="env") as (env_url, _),
    ):
        peers = {
            "model": Target.single("model", model_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        agent_opts = {"model": "model", "resources": "env"}
        async with serve_server("tool_agent", name="agent", options=agent_opts, peers=peers) as (
            agent_url,
            _,
        ):
            yield agent_url


async def run(agent_url: str, row: dict[str, Any]) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(agent_url + "/run", json=row) as answer,
    ):
        body = await answer.json()
        assert answer.status == 200, body
        return dict(body)


def row(text: str = "please echo v7") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": text, "tools": [ECHO_TOOL], "temperature": 0.6},
        "expected_answer": "v7",
    }


def calls_of(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items carrying token data: one per model call."""
    return [item for item in output if all(k in item for k in TRAINING)]


def assert_training_record(upstream: VllmDouble, verified: dict[str, Any]) -> None:
    output = verified["response"]["output"]
    carried = calls_of(output)
    assert len(carried) == len(upstream.generated) == len(upstream.prompts)
    for item, prompt, generated in zip(carried, upstream.prompts, upstream.generated, strict=True):
        assert item["prompt_token_ids"] == prompt
        assert item["generation_token_ids"] == generated
        assert item["generation_log_probs"] == [logprob(t) for t in generated]
        assert all(isinstance(t, int) for t in item["generation_token_ids"])
    # Each call's fields sit on its last item: the next item starts another call or is a tool's.
    for item in carried:
        after = output[output.index(item) + 1 :]
        assert not after or after[0]["type"] == "function_call_output"


@pytest.mark.parametrize("new_vllm", [True, False], ids=["return_token_ids", "tokenize"])
async def test_every_call_of_a_multi_turn_rollout_carries_its_tokens(new_vllm: bool) -> None:
    upstream = VllmDouble(new_vllm=new_vllm)
    upstream.tool_turns = 2
    async with agent_stack(upstream) as agent:
        verified = await run(agent, row())
    assert verified["reward"] == 1.0
    assert len(upstream.requests) == 3
    assert_training_record(upstream, verified)
    # The first call's ids are the toy template's, spelt out by hand.
    first = calls_of(verified["response"]["output"])[0]
    assert first["prompt_token_ids"] == ids(f"<user>please echo v7{END}{GEN_PROMPT}")
    assert first["generation_token_ids"] == ids('<call>echo {"text":"v7"}</call>' + END)
    sent = upstream.requests[0]
    assert sent["logprobs"] is True and sent["top_logprobs"] == 0
    assert sent["return_tokens_as_token_ids"] is True and sent["return_token_ids"] is True
    assert sent["temperature"] == 0.6
    # An older vLLM sends no prompt ids: the proxy renders the same prompt with /tokenize.
    if new_vllm:
        assert upstream.tokenize_requests == []
    else:
        assert len(upstream.tokenize_requests) == 3
        assert set(upstream.tokenize_requests[0]) == {"model", "messages", "tools"}
    assert verified["drifted_turns"] == 0
    assert verified["rollgym_drift"] == {"checked": 2, "turns": []}
    # The raw passthrough stays, one entry per call.
    assert len(verified["response"]["rollgym_upstream"]) == 3


async def test_drift_is_counted_on_the_rollout_and_in_metrics(tmp_path: Path) -> None:
    upstream = VllmDouble()
    upstream.tool_turns = 2
    upstream.drift = True  # the template re-serialises the model's tool-call JSON
    async with agent_stack(upstream) as agent:
        verified = await run(agent, row())
    assert_training_record(upstream, verified)  # each call's own data is still right
    assert verified["drifted_turns"] == 2
    assert verified["rollgym_drift"] == {"checked": 2, "turns": [1, 2]}

    clean = {**verified, "task_index": 1, "rollout_index": 0, "drifted_turns": 0}
    lines = [{**verified, "task_index": 0, "rollout_index": 0}, clean]
    (tmp_path / "rollouts.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    metrics = compute_metrics(tmp_path, total=2, repeats=1).to_dict()
    assert metrics["token_drift"] == {
        "checked_rollouts": 2,
        "drifted_rollouts": 1,
        "drifted_turns": 2,
    }
    assert metrics["agent_fields"]["drifted_turns"] == 1.0  # the mean over rollouts


async def test_reasoning_round_trips_and_carries_the_tokens() -> None:
    upstream = VllmDouble(reasoning="Use the tool.")
    upstream.reasoning_key = "reasoning"  # vLLM >= 0.16's name
    async with agent_stack(upstream) as agent:
        verified = await run(agent, row())
    output = verified["response"]["output"]
    kinds = [item["type"] for item in output]
    assert kinds == ["reasoning", "function_call", "function_call_output", "reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "Use the tool."}]
    assert_training_record(upstream, verified)
    # Fed back on the next turn as the model wrote it: no drift.
    second = upstream.requests[1]["messages"][1]
    assert second["reasoning_content"] == second["reasoning"] == "Use the tool."
    assert verified["drifted_turns"] == 0


async def test_the_openai_sdk_reads_the_fields_from_a_plain_answer() -> None:
    upstream = VllmDouble()
    # idle_timeout null: the proxy asks for a whole answer, not a stream.
    async with (
        proxy_in_front(upstream, idle_timeout=None) as url,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10) as sdk,
    ):
        # seed and stop are not Responses API parameters: the SDK sends them as extra_body.
        extra = {"seed": 3, "stop": ["\n\n"], "top_k": 20}
        response = await sdk.responses.create(model="toy", input="hi", extra_body=extra)
    check_response(response.model_dump())
    [message] = response.output
    extra = message.model_extra or {}
    assert extra["generation_token_ids"] == ids("The answer is hi" + END)
    assert extra["prompt_token_ids"] == ids(f"<user>hi{END}{GEN_PROMPT}")
    assert "stream" not in upstream.requests[0]
    sent = upstream.requests[0]
    # Translated or passed through, never dropped (top_k: vLLM's own sampling parameter).
    assert sent["seed"] == 3 and sent["stop"] == ["\n\n"] and sent["top_k"] == 20


async def test_an_answer_without_logprobs_fails_the_call_typed() -> None:
    upstream = VllmDouble()
    upstream.ignore_logprobs = True  # an upstream that answers without what was asked
    async with proxy_in_front(upstream) as url:
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(url + "/v1/responses", json={"input": "hi"}) as answer,
        ):
            body = await answer.json()
    assert answer.status == 502
    origin = body["error"]["origin"]
    assert origin["type"] == "protocol_error" and origin["server"] == "model.upstream"
    assert "no per-token logprobs" in origin["message"]


# -- pure checks -----------------------------------------------------------------------------


def completion(**changes: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
        "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5, "top_logprobs": []}]},
        "token_ids": [5],
    }
    choice.update(changes.pop("choice", {}))
    return {"choices": [choice], "prompt_token_ids": [1, 2], **changes}


def test_call_tokens_from_each_source_and_their_disagreement() -> None:
    assert call_tokens(completion(), upstream="u") == CallTokens([1, 2], [5], [-0.5])
    old = completion(choice={"token_ids": None}, prompt_token_ids=None)
    tokens = call_tokens(old, upstream="u", tokenized={"tokens": [1, 2, 3], "count": 3})
    assert tokens == CallTokens([1, 2, 3], [5], [-0.5])
    bad = [
        (completion(choice={"token_ids": [6]}), "disagree"),
        (completion(prompt_token_ids=None), "no prompt token ids"),
        (completion(choice={"logprobs": None}), "no per-token logprobs"),
        (completion(choice={"logprobs": {"content": [{"token": "ok", "logprob": -1}]}}), "'ok'"),
        (completion(choice={"logprobs": {"content": [{"token": "token_id:5"}]}}), "logprob is"),
    ]
    for answer, message in bad:
        with pytest.raises(ProtocolError, match=message):
            call_tokens(answer, upstream="u")


def test_drift_compares_each_prompt_with_the_previous_call() -> None:
    a = CallTokens([1, 2], [3], [-1.0])
    b = CallTokens([1, 2, 3, 9], [4], [-1.0])
    c = CallTokens([1, 2, 7, 9], [4], [-1.0])
    assert drifted_turns([a, b]).turns == ()
    assert drifted_turns([a, c]).turns == (1,)
    assert drifted_turns([a, None, c]).checked == 0
