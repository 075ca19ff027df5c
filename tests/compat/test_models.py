"""Model servers as NeMo Gym's vLLM client and OpenAI clients see them: ``GET /v1/models`` and
vLLM's ``POST /tokenize`` (at the root; NeMo Gym strips ``/v1`` from its base URL to reach it,
sends ``model``, ``messages``, ``tools``, ``chat_template_kwargs`` and reads ``tokens``)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from openai.types import Model

from rollgym.testing import serve_asgi, serve_server
from tests.compat.nemo import TOKENS, Recorded, fake_vllm_app
from tests.compat.test_aggregate import post
from tests.support.stack import ECHO_TOOL

pytestmark = pytest.mark.timeout(60)

NEMO_TOKENIZE = {
    "model": "policy",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
    "chat_template_kwargs": {"enable_thinking": False},
}


async def get(url: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
        http.get(url) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


def assert_model_list(body: Any, ids: list[str]) -> None:
    assert body["object"] == "list"
    assert [Model.model_validate(m).id for m in body["data"]] == ids


async def test_the_scripted_model_lists_itself() -> None:
    async with serve_server("scripted", name="model") as (url, _):
        status, body = await get(f"{url}/v1/models")
    assert status == 200
    assert_model_list(body, ["rollgym-scripted"])


async def test_the_scripted_model_tokenizes_deterministically_like_vllm() -> None:
    async with serve_server("scripted", name="model") as (url, _):
        status, first = await post(f"{url}/tokenize", NEMO_TOKENIZE)
        _, again = await post(f"{url}/tokenize", NEMO_TOKENIZE)
        _, other = await post(f"{url}/tokenize", {**NEMO_TOKENIZE, "messages": []})
        _, prompt = await post(
            f"{url}/tokenize", {"prompt": "two plus two", "return_token_strs": True}
        )
        bad_status, bad = await post(f"{url}/tokenize", {"model": "policy"})
    assert status == 200
    assert set(first) == {"count", "max_model_len", "tokens", "token_strs"}
    assert first == again  # the same request, the same ids
    assert first["tokens"] != other["tokens"]
    assert first["count"] == len(first["tokens"]) > 0
    assert all(isinstance(t, int) and t >= 0 for t in first["tokens"])
    assert first["token_strs"] is None  # only on request, as vLLM
    assert prompt["token_strs"] == ["<s>", "two", "plus", "two"]
    assert prompt["tokens"][1] == prompt["tokens"][3]  # one word, one id
    assert bad_status == 400 and bad["error"]["type"] == "invalid_request"


async def test_the_proxy_passes_tokenize_to_the_upstreams_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPAT_UPSTREAM_KEY", "sk-compat-secret-123")
    seen = Recorded()
    async with serve_asgi(fake_vllm_app(seen)) as upstream:
        options = {
            "base_url": f"{upstream}/v1",
            "model": "served-name",
            "api_key_env": "COMPAT_UPSTREAM_KEY",
            "extra_body": {"logprobs": True},  # chat only: /tokenize takes no sampling knobs
        }
        async with serve_server("openai_proxy", name="model", options=options) as (url, _):
            status, body = await post(f"{url}/tokenize", NEMO_TOKENIZE)
    assert (status, body) == (200, TOKENS)
    ((path, headers, sent),) = seen.calls
    assert path == "/tokenize"
    assert sent == {**NEMO_TOKENIZE, "model": "served-name"}
    assert headers["authorization"] == "Bearer sk-compat-secret-123"


async def test_an_upstream_refusing_tokenize_is_answered_with_its_error_as_origin() -> None:
    seen = Recorded()
    async with serve_asgi(fake_vllm_app(seen, tokenize_status=400)) as upstream:
        options = {"base_url": f"{upstream}/v1"}
        async with serve_server("openai_proxy", name="model", options=options) as (url, _):
            status, body = await post(f"{url}/tokenize", NEMO_TOKENIZE)
    assert status == 502
    origin = body["error"]["origin"]
    assert (origin["server"], origin["status"], origin["endpoint"]) == (
        "model.upstream_root",
        400,
        "/tokenize",
    )


async def test_the_proxy_lists_its_model_and_says_so_when_it_cannot() -> None:
    seen = Recorded()
    async with serve_asgi(fake_vllm_app(seen)) as upstream:
        named = {"base_url": f"{upstream}/v1", "model": "served-name"}
        async with serve_server("openai_proxy", name="model", options=named) as (url, _):
            status, body = await get(f"{url}/v1/models")
        async with serve_server(
            "openai_proxy", name="model", options={"base_url": f"{upstream}/v1"}
        ) as (url, _):
            unnamed_status, unnamed = await get(f"{url}/v1/models")
    assert status == 200
    assert_model_list(body, ["served-name"])
    assert unnamed_status == 501
    assert "options.model" in unnamed["error"]["message"]
    assert seen.calls == []


async def test_the_scripted_model_still_answers_chat_with_tools_after_tokenize() -> None:
    # The tokenizer is a side route: a NeMo Gym vLLM client calls chat, then tokenize.
    chat = {
        "model": "policy",
        "messages": [{"role": "user", "content": "v1"}],
        "tools": [
            {
                "type": "function",
                "function": {"name": "echo", "parameters": ECHO_TOOL["parameters"]},
            }
        ],
    }
    async with serve_server("scripted", name="model") as (url, _):
        status, completion = await post(f"{url}/v1/chat/completions", chat)
        tok_status, _ = await post(f"{url}/tokenize", chat)
    assert (status, tok_status) == (200, 200)
    assert completion["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "echo"
