"""The CPU backend (``rollgym.models.local``) served for real on 127.0.0.1, with a tiny model
built at test time (``rollgym.models.tiny``) and, for the tool-calling tests, the same model
fitted for a few seconds to answer the echo task (call ``echo``, then say the answer): so a
real transformers model writes the hermes tool call that the backend parses, and a whole
rollout through ``openai_proxy`` (``return_token_ids``), the tool agent and the echo env ends in
a trainer sample."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from rollgym.control_token import authorization, control_token
from rollgym.http import Target
from rollgym.integrations.samples import rollout_samples
from rollgym.models.local import WEIGHTS_ENDPOINT
from rollgym.models.tiny import build_tiny_model
from rollgym.models.tokens import call_tokens, token_request
from rollgym.models.translate import responses_to_chat
from rollgym.testing import serve_server
from rollgym.trainer import collect_batch
from rollgym.wire import POLICY_VERSION

from ..support.stack import ECHO_TOOL, fast_policy

pytestmark = pytest.mark.timeout(120)

LOCAL = "rollgym.models.local:LocalModel"
TOOLS_OUTPUT = '{"echo":"v7"}'  # the tool agent's compact JSON of the echo env's answer
CALL_TEXT = '<tool_call>{"name": "echo", "arguments": {"text": "v7"}}</tool_call>'
ANSWER = "The answer is v7"


def echo_params(**extra: Any) -> dict[str, Any]:
    return {"input": "task 7", "tools": [ECHO_TOOL], "temperature": 0, "max_output_tokens": 40,
            **extra}  # fmt: skip


def echo_turns() -> list[tuple[dict[str, Any], str]]:
    """The echo task's two model calls as the proxy sends them, and what to answer to each."""
    first = responses_to_chat(echo_params())
    call = {"type": "function_call", "call_id": "c1", "name": "echo",
            "arguments": '{"text": "v7"}'}  # fmt: skip
    output = {"type": "function_call_output", "call_id": "c1", "output": TOOLS_OUTPUT}
    second = responses_to_chat(echo_params(input=[
        {"type": "message", "role": "user", "content": "task 7"}, call, output]))  # fmt: skip
    return [(first, CALL_TEXT), (second, ANSWER)]


def fit_echo(base: Path, out: Path, steps: int = 60) -> Path:
    """``base`` trained until it answers the echo task (about 7 s on one core)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(base, out)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    data = []
    for chat, target in echo_turns():
        prompt = tok.apply_chat_template(
            chat["messages"], tools=chat["tools"], tokenize=False, add_generation_prompt=True
        )
        a = tok(prompt, add_special_tokens=False)["input_ids"]
        b = tok(target + "<|im_end|>", add_special_tokens=False)["input_ids"]
        data.append((torch.tensor([a + b]), len(a)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(steps):
            for ids, n in data:
                labels = ids.clone()
                labels[:, :n] = -100
                model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)  # what the backend sets too: on a busy 2-core box, much faster
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.fixture(scope="module")
def trained(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fit_echo(tiny, tmp_path_factory.mktemp("m") / "trained")


def local(model: Path, **options: Any) -> Any:
    return serve_server(LOCAL, name="model", options={"model_dir": str(model), **options})


async def post(url: str, body: Any, *, timeout: float = 60) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
        http.post(url, json=body, headers=authorization(control_token())) as answer,
    ):
        return answer.status, await answer.json(), answer.headers


async def until(condition: Callable[[], bool], seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 (the server's own state, polled)
            await asyncio.sleep(0.01)


def chat(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], **extra}


# -- token data ------------------------------------------------------------------------------


async def test_token_data_through_the_proxy_is_what_the_model_computes(tiny: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    async with local(tiny) as (url, _):
        body = token_request(chat(max_tokens=12, temperature=0.7, seed=5))
        status, completion, _ = await post(url + "/v1/chat/completions", body)
        assert status == 200, completion
        tokens = call_tokens(completion, upstream="model")  # rollgym's own reader accepts it
        assert len(tokens.generation_token_ids) == completion["usage"]["completion_tokens"] > 0
        assert completion[POLICY_VERSION] == 0
        # The same prompt ids as /tokenize (vLLM's shape), and the same as the proxy records.
        status, tokenized, _ = await post(url + "/tokenize", {"messages": body["messages"]})
        assert tokenized["tokens"] == tokens.prompt_token_ids
        options = {"base_url": url + "/v1", "model": "tiny", "return_token_ids": True}
        async with serve_server("openai_proxy", name="proxy", options=options) as (proxy, _):
            params = {"input": "hello", "max_output_tokens": 12, "temperature": 0.7, "seed": 5}
            status, response, _ = await post(proxy + "/v1/responses", params)
        assert status == 200, response
        last = response["output"][-1]
        assert last["prompt_token_ids"] == tokens.prompt_token_ids
        assert last["generation_token_ids"] == tokens.generation_token_ids  # same seed
    # The logprobs are log_softmax(logits / temperature) of the model over the whole sequence:
    # what TRL's GRPOTrainer computes for the same tokens (its importance-sampling ratio is 1).
    model = AutoModelForCausalLM.from_pretrained(tiny)
    ids = tokens.prompt_token_ids + tokens.generation_token_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / 0.7, dim=-1)
    n = len(tokens.prompt_token_ids)
    expected = [float(logp[n - 1 + k, t]) for k, t in enumerate(tokens.generation_token_ids)]
    assert tokens.generation_log_probs == pytest.approx(expected, abs=1e-4)


async def test_the_openai_sdk_reads_a_parsed_tool_call(trained: Path) -> None:
    first, _ = echo_turns()[0]
    async with local(trained) as (url, _):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        completion = await client.chat.completions.create(
            model="tiny", messages=first["messages"], tools=first["tools"], temperature=0,
            max_tokens=40, logprobs=True, top_logprobs=2,
        )  # fmt: skip
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls or []
        assert call.type == "function"
        assert (call.function.name, call.function.arguments) == ("echo", '{"text": "v7"}')
        assert choice.logprobs is not None and choice.logprobs.content
        assert all(len(e.top_logprobs) == 2 for e in choice.logprobs.content)
        # tool_choice none: the same text stays text.
        plain = await client.chat.completions.create(
            model="tiny", messages=first["messages"], tools=first["tools"], temperature=0,
            max_tokens=40, tool_choice="none",
        )  # fmt: skip
        assert plain.choices[0].finish_reason == "stop"
        assert plain.choices[0].message.content == CALL_TEXT
        assert not plain.choices[0].message.tool_calls


async def test_a_rollout_through_proxy_agent_and_env_gives_a_sample(trained: Path) -> None:
    from transformers import AutoTokenizer

    async with (
        local(trained) as (model_url, _),
        serve_server("openai_proxy", name="model", options={
            "base_url": model_url + "/v1", "model": "tiny", "return_token_ids": True,
        }) as (proxy_url, _),
        serve_server("echo", name="env") as (env_url, _),
    ):  # fmt: skip
        peers = {
            "model": Target.single("model", proxy_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        options = {"model": "model", "resources": "env"}
        async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
            agent_url,
            _,
        ):
            row = {"responses_create_params": echo_params(), "expected_answer": "v7"}
            (group,) = await collect_batch([row], agent=agent_url, rollout_timeout=90)
    (record,) = group.rollouts
    assert record.reward == 1.0, record
    (sample,) = rollout_samples(record)
    assert sample.reward == 1.0 and not sample.masked
    assert sample.policy_versions == (0, 0)  # both calls ran under the weights served at start
    tok = AutoTokenizer.from_pretrained(trained)
    # The sample's ids decode to the whole conversation as the chat template renders it.
    chat = responses_to_chat(echo_params(input=[
        {"type": "message", "role": "user", "content": "task 7"},
        {"type": "function_call", "call_id": "c1", "name": "echo", "arguments": '{"text": "v7"}'},
        {"type": "function_call_output", "call_id": "c1", "output": TOOLS_OUTPUT},
        {"type": "message", "role": "assistant", "content": ANSWER},
    ]))  # fmt: skip
    rendered = tok.apply_chat_template(chat["messages"], tools=chat["tools"], tokenize=False)
    text = tok.decode(sample.prompt_ids + sample.completion_ids)
    assert text == rendered.removesuffix("\n")
    # Generated tokens are masked in, the tool's answer between the calls masked out.
    fed = [t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m == 0]
    assert TOOLS_OUTPUT in tok.decode(fed)
    said = [t for t, m in zip(sample.completion_ids, sample.mask, strict=True) if m == 1]
    assert tok.decode(said) == CALL_TEXT + "<|im_end|>" + ANSWER + "<|im_end|>"


# -- weights ---------------------------------------------------------------------------------


async def test_pushed_weights_change_the_outputs_and_the_version(
    tiny: Path, trained: Path, tmp_path: Path
) -> None:
    first, _ = echo_turns()[0]
    body = {**first, "model": "tiny", "temperature": 1.0, "seed": 11, "max_tokens": 40,
            "logprobs": True}  # fmt: skip
    # The root holds every model these tests build (each in a folder of its own).
    async with local(tiny, weights_root=str(tmp_path.parent)) as (url, _):
        _, before, _ = await post(url + "/v1/chat/completions", body)
        _, again, _ = await post(url + "/v1/chat/completions", body)
        assert again["choices"][0]["logprobs"] == before["choices"][0]["logprobs"]  # seeded
        status, pushed, _ = await post(url + WEIGHTS_ENDPOINT, {"path": str(trained), "version": 3})
        assert status == 200, pushed
        assert pushed[POLICY_VERSION] == 3 and pushed["previous_version"] == 0
        _, after, _ = await post(url + "/v1/chat/completions", body)
        assert before[POLICY_VERSION] == 0 and after[POLICY_VERSION] == 3
        assert after["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "echo"
        assert after["choices"][0]["logprobs"] != before["choices"][0]["logprobs"]
        # Stale or repeated versions are refused, and the served weights stay.
        for version in (3, 2):
            status, refused, _ = await post(
                url + WEIGHTS_ENDPOINT, {"path": str(tiny), "version": version}
            )
            assert status == 409, refused
            assert "stale" in refused["error"]["message"]
        # Another architecture is refused, naming a tensor.
        wide = build_tiny_model(tmp_path / "wide", hidden_size=64, num_heads=1)
        deep = build_tiny_model(tmp_path / "deep", num_layers=3)
        for other, says in ((wide, "has shape"), (deep, "'model.layers.2.")):
            status, refused, _ = await post(
                url + WEIGHTS_ENDPOINT, {"path": str(other), "version": 4}
            )
            assert status == 422, refused
            assert says in refused["error"]["message"], refused
        status, refused, _ = await post(
            url + WEIGHTS_ENDPOINT, {"path": str(tmp_path / "nowhere"), "version": 4}
        )
        assert status == 400, refused
        async with aiohttp.ClientSession() as http, http.get(url + WEIGHTS_ENDPOINT) as answer:
            assert (await answer.json())[POLICY_VERSION] == 3
        # Back to the first weights under a newer version: the first answer again.
        status, _, _ = await post(url + WEIGHTS_ENDPOINT, {"path": str(tiny), "version": 4})
        _, back, _ = await post(url + "/v1/chat/completions", body)
        assert back["choices"][0]["logprobs"] == before["choices"][0]["logprobs"]
        assert back[POLICY_VERSION] == 4


# -- bounds ----------------------------------------------------------------------------------

DEEP: Any = {}
for _ in range(900):  # under the JSON parser's 1024 levels, past what rendering can recurse
    DEEP = {"a": DEEP}

ADVERSARIAL: list[tuple[str, Any, str]] = [
    ("huge max_tokens", chat(max_tokens=10**12), "cap"),
    ("negative temperature", chat(temperature=-1), "temperature"),
    ("temperature as text", chat(temperature="hot"), "temperature"),
    ("top_p 0", chat(top_p=0), "top_p"),
    ("messages not a list", {"messages": "hi"}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("message not an object", {"messages": ["hi"]}, "messages[0]"),
    ("image content", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "text parts"),
    ("tool call without name", {"messages": [{"role": "assistant", "tool_calls": [{}]}]},
     "function.name"),
    ("n 2", chat(n=2), "n must be 1"),
    ("logit_bias", chat(logit_bias={"5": 100}), "logit_bias"),
    ("response_format", chat(response_format={"type": "json_object"}), "response_format"),
    ("unknown field", chat(guided_regex="a+"), "guided_regex"),
    ("penalty", chat(presence_penalty=1.5), "presence_penalty"),
    ("forced tool", chat(tool_choice="required"), "tool_choice"),
    ("bad tools", chat(tools=[{"type": "function"}]), "tools[0]"),
    ("seed text", chat(seed="s"), "seed"),
    ("boolean max_tokens", chat(max_tokens=True), "max_tokens"),
    ("too many stops", chat(stop=["a"] * 50), "stop"),
    ("prompt past the context", chat("hello " * 400), "context"),
    ("max_tokens past the context", chat(max_tokens=127), "context"),
    ("body not an object", [1, 2], "JSON object"),
    ("deeply nested tool", chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": DEEP}}]), "nested"),
]  # fmt: skip


async def test_adversarial_requests_are_4xx(tiny: Path) -> None:
    async with local(tiny, max_model_len=128, max_tokens_cap=200) as (url, _):
        for name, body, says in ADVERSARIAL:
            status, answer, _ = await post(url + "/v1/chat/completions", body)
            assert 400 <= status < 500, (name, answer)
            assert says in answer["error"]["message"], (name, answer)
        async with (
            aiohttp.ClientSession() as http,
            http.post(url + "/v1/chat/completions", data=b"{not json") as answer,
        ):
            assert answer.status == 400
        for push in ({"path": 5, "version": 1}, {"path": "x", "version": "1"},
                     {"path": "x", "version": -1}, {"version": 1}):  # fmt: skip
            status, answer, _ = await post(url + WEIGHTS_ENDPOINT, push)
            assert status == 400, (push, answer)
        status, answer, _ = await post(url + "/tokenize", {"nothing": 1})
        assert status == 400
        # Sampling values at the edge of what is valid sample, never a 500 (1e-300 / logits
        # is infinite; a top_p whose mass underflows would drop every token).
        for edge in ({"temperature": 1e-300}, {"temperature": 1e-45}, {"top_p": 1e-300}):
            status, answer, _ = await post(url + "/v1/chat/completions", chat(max_tokens=2, **edge))
            assert status == 200, (edge, answer)
        # Still serving.
        status, answer, _ = await post(url + "/v1/chat/completions", chat(max_tokens=3))
        assert status == 200 and answer["usage"]["completion_tokens"] <= 3


async def test_a_full_queue_is_503_and_a_gone_caller_frees_the_worker(tiny: Path) -> None:
    # Greedy on the random model: it never ends its turn within 2000 tokens (seconds of work).
    long = chat("the quick brown fox", max_tokens=2000, temperature=0)
    async with local(tiny, max_queue=0, retry_after=3, max_tokens_cap=4000) as (url, server):
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

        async def generate() -> bytes:
            async with http.post(url + "/v1/chat/completions", json=long) as answer:
                return await answer.read()

        running = asyncio.create_task(generate())
        await until(lambda: server.health()["queue"]["pending"] == 1)
        status, answer, headers = await post(url + "/v1/chat/completions", chat(max_tokens=2))
        assert status == 503, answer
        assert headers["Retry-After"] == "3"
        assert answer["error"]["retryable"] is True
        running.cancel()  # the caller goes away mid-generation
        await http.close()
        await until(lambda: server.health()["queue"]["pending"] == 0)
        status, answer, _ = await post(url + "/v1/chat/completions", chat(max_tokens=2))
        assert status == 200, answer


async def test_a_request_past_its_deadline_is_504(tiny: Path) -> None:
    long = chat("the quick brown fox", max_tokens=2000, temperature=0)
    async with local(tiny, request_timeout=0.3, max_tokens_cap=4000) as (url, _):
        status, answer, _ = await post(url + "/v1/chat/completions", long)
        assert status == 504, answer
        assert answer["error"]["type"] == "deadline_exceeded"
        status, answer, _ = await post(url + "/v1/chat/completions", chat(max_tokens=2))
        assert status == 200, answer


async def test_responses_endpoint_and_streaming(tiny: Path) -> None:
    async with local(tiny) as (url, _):
        client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        response = await client.responses.create(
            model="tiny", input="hello", max_output_tokens=5, temperature=0
        )
        extra = response.output[-1].model_extra or {}
        assert len(extra["generation_token_ids"]) == response.usage.output_tokens  # type: ignore[union-attr]
        assert (response.model_extra or {})[POLICY_VERSION] == 0
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            temperature=0, stream=True,
        )  # fmt: skip
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        whole = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
        )
        assert text == whole.choices[0].message.content
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
