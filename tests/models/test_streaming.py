"""``"stream": true`` on both model servers, parsed by the real ``openai`` SDK's streaming calls,
and the proxy's opt-in streaming from its upstream (``upstream_stream: true``): a silent
upstream fails the attempt after ``idle_timeout`` and is retried, a slow but steady one is never
cut. The default, whole answers watched by health probes, is ``test_liveness``'s."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import Response as SDKResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from rollgym.testing import serve_asgi, serve_server

from .test_proxy import WEATHER_TOOL, FakeUpstream, proxy, vllm_chunks

pytestmark = pytest.mark.timeout(30)

ECHO_TOOL = {
    "type": "function",
    "name": "echo",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}
CALL_THEN_SAY = [{"call": "echo", "arguments": {"text": "v1"}}, {"say": "It is {tool_output}"}]


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)


@pytest.fixture
async def scripted() -> AsyncIterator[str]:
    async with serve_server("scripted", name="model") as (url, _):
        yield url


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    async with serve_asgi(fake.app) as url:
        fake.url = url
        yield fake


# -- the scripted model ----------------------------------------------------------------------


async def test_scripted_responses_stream_helper_gives_the_unstreamed_answer(scripted: str) -> None:
    meta = {"rollgym_script": json.dumps(CALL_THEN_SAY)}
    async with sdk(scripted) as client:
        whole = await client.responses.create(
            model="m",
            input="echo v1",
            tools=[ECHO_TOOL],
            metadata=meta,  # type: ignore[list-item]
        )
        async with client.responses.stream(
            model="m",
            input="echo v1",
            tools=[ECHO_TOOL],
            metadata=meta,  # type: ignore[list-item]
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    [call] = [item for item in final.output if item.type == "function_call"]
    [expected] = [item for item in whole.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("echo", {"text": "v1"})
    assert call.arguments == expected.arguments
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    sequence = [k for k in kinds if k.startswith("response.output_item")]
    assert sequence == ["response.output_item.added", "response.output_item.done"]


async def test_scripted_responses_create_stream_true_yields_typed_events(scripted: str) -> None:
    script = {"rollgym_script": json.dumps([{"say": "streamed hello"}])}
    async with sdk(scripted) as client:
        stream = await client.responses.create(model="m", input="hi", metadata=script, stream=True)
        events = [event async for event in stream]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "streamed hello"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    assert isinstance(completed.response, SDKResponse)
    assert completed.response.output_text == "streamed hello"


async def test_scripted_chat_stream_carries_text_tool_calls_and_usage(scripted: str) -> None:
    script = {"rollgym_script": json.dumps(CALL_THEN_SAY)}
    tool = {"type": "function", "function": {"name": "echo", "parameters": ECHO_TOOL["parameters"]}}
    async with sdk(scripted) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], tools=[tool],  # type: ignore[list-item]
            metadata=script, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in stream]
        async with client.chat.completions.stream(
            model="m",
            messages=[{"role": "user", "content": "go"}],
            tools=[tool],  # type: ignore[list-item]
            metadata=script,
        ) as helper:
            final = await helper.get_final_completion()
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    finish = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finish == ["tool_calls"]
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "echo"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"text": "v1"}  # type: ignore[union-attr]


# -- the proxy, clients streaming ------------------------------------------------------------


async def test_proxy_responses_stream_matches_the_whole_answer(upstream: FakeUpstream) -> None:
    upstream.reasoning = "Need the weather."
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    async with proxy(upstream) as (url, _), sdk(url) as client:
        whole = await client.responses.create(model="m", input=question, tools=[WEATHER_TOOL])  # type: ignore[arg-type,list-item]
        async with client.responses.stream(model="m", input=question, tools=[WEATHER_TOOL]) as s:  # type: ignore[arg-type,list-item]
            kinds = [e.type async for e in s]
            final = await s.get_final_response()
    assert [i.type for i in final.output] == [i.type for i in whole.output]
    assert [i.type for i in final.output] == ["reasoning", "function_call"]
    assert final.output[1].arguments == whole.output[1].arguments == '{"city": "Oslo"}'  # type: ignore[union-attr]
    assert "response.reasoning_text.delta" in kinds
    assert final.usage is not None and final.usage.output_tokens == 3


async def test_proxy_chat_stream_passes_the_upstream_chunks_on(upstream: FakeUpstream) -> None:
    async with proxy(upstream, upstream_stream=True) as (url, _), sdk(url) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi there"}], stream=True
        )
        chunks = [c async for c in stream]
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hi there"
    )
    assert chunks[0].model_extra and chunks[0].model_extra["prompt_token_ids"] == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
    ]
    [sent] = upstream.requests
    assert sent["stream"] is True and "stream_options" not in sent  # the client's, unchanged


async def test_proxy_streams_an_upstream_that_cannot(upstream: FakeUpstream) -> None:
    upstream.plain = True
    async with proxy(upstream) as (url, _), sdk(url) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = [c async for c in stream]
        whole = await client.responses.create(model="m", input="plain")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hi"
    assert whole.output_text == "echo: plain"


async def test_proxy_chat_stream_by_default_restreams_the_whole_answer(
    upstream: FakeUpstream,
) -> None:
    async with proxy(upstream) as (url, _), sdk(url) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi there"}], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: hi there"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    [sent] = upstream.requests
    assert "stream" not in sent and "stream_options" not in sent  # asked for whole


async def test_streamed_upstream_keeps_vllm_token_fields(upstream: FakeUpstream) -> None:
    async with proxy(upstream, upstream_stream=True) as (url, _), sdk(url) as client:
        raw = await client.responses.with_raw_response.create(model="m", input="hello there")
    extras = raw.http_response.json()["rollgym_upstream"]
    # Chunked one id per 4 characters by the fake vLLM: joined back in order, none made up.
    assert extras["token_ids"] == [11, 12, 13]
    assert extras["prompt_token_ids"] == [1, 2, 3, 4, 5, 6, 7]


# -- the proxy's upstream: silent, slow, cut, failing mid-stream -----------------------------


class StreamingUpstream:
    """Chat completions streamed by a script per request: ``"hang"`` (never a byte),
    ``"slow"`` (a chunk every ``gap`` seconds), ``"cut"`` (stops before [DONE]),
    ``"error:<code>"`` (an error event after the first chunk, as vLLM sends), else whole."""

    def __init__(self, plan: list[str], gap: float = 0.0) -> None:
        self.plan, self.gap, self.requests = plan, gap, 0
        self.release = asyncio.Event()  # ends the hangs, so that the server can stop
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests += 1
        step = self.plan.pop(0) if self.plan else "ok"
        if step == "hang":
            await self.release.wait()
        chunks = vllm_chunks(FakeUpstream()._completion(body), usage=True)
        events = [f"data: {json.dumps(c)}\n\n" for c in chunks]
        if step == "cut":
            return Response("".join(events[:3]), media_type="text/event-stream")
        if step.startswith("error:"):
            error = {"error": {"message": "NaN in logprobs", "code": int(step[6:])}}
            events = [events[0], f"data: {json.dumps(error)}\n\n"]
        return StreamingResponse(
            self._paced([*events, "data: [DONE]\n\n"]), media_type="text/event-stream"
        )

    async def _paced(self, events: list[str]) -> AsyncIterator[str]:
        for event in events:
            await asyncio.sleep(self.gap)
            yield event


async def _ask(upstream: StreamingUpstream, **options: Any) -> tuple[str | Exception, int]:
    async with serve_asgi(upstream.app) as base:
        fake = FakeUpstream()
        fake.url = base
        opts = {"upstream_stream": True, **options}
        async with proxy(fake, **opts) as (url, _), sdk(url) as client:
            try:
                response = await client.responses.create(model="m", input="are you there")
            except openai.APIStatusError as exc:
                return exc, upstream.requests
            finally:
                upstream.release.set()
    return response.output_text, upstream.requests


async def test_a_silent_upstream_fails_the_attempt_after_idle_timeout_and_is_retried() -> None:
    upstream = StreamingUpstream(["hang"])
    answer, requests = await _ask(upstream, timeout=20, idle_timeout=0.5)
    assert (answer, requests) == ("echo: are you there", 2)


async def test_a_slow_steady_stream_is_not_cut_by_the_idle_timeout() -> None:
    # 9 events 0.2 s apart: 1.8 s in all, over three times the idle timeout.
    upstream = StreamingUpstream([], gap=0.2)
    answer, requests = await _ask(upstream, timeout=20, idle_timeout=0.5)
    assert (answer, requests) == ("echo: are you there", 1)


async def test_a_silent_upstream_on_every_attempt_fails_as_a_read_timeout() -> None:
    upstream = StreamingUpstream(["hang", "hang"])
    err, requests = await _ask(upstream, timeout=20, idle_timeout=0.3, upstream_retry={
        "max_attempts": 2, "backoff_initial": 0.01})  # fmt: skip
    assert isinstance(err, openai.APIStatusError) and err.status_code == 504
    origin = err.body["origin"]  # type: ignore[index]
    assert (origin["type"], origin["attempts"]) == ("read_timeout", 2)
    assert "sent nothing for 0.3s" in origin["message"]
    assert requests == 2


async def test_a_stream_cut_before_done_is_retried_never_used() -> None:
    upstream = StreamingUpstream(["cut"])
    answer, requests = await _ask(upstream, idle_timeout=5)
    assert (answer, requests) == ("echo: are you there", 2)


@pytest.mark.parametrize(("code", "requests"), [(500, 2), (400, 1)])
async def test_an_error_event_mid_stream_fails_like_its_status(code: int, requests: int) -> None:
    upstream = StreamingUpstream([f"error:{code}"])
    answer, made = await _ask(upstream, idle_timeout=5)
    assert made == requests
    if code == 500:
        assert answer == "echo: are you there"
    else:
        assert isinstance(answer, openai.APIStatusError)
        origin = answer.body["origin"]  # type: ignore[index]
        assert origin["status"] == 400 and "NaN in logprobs" in origin["message"]


async def test_idle_timeout_null_asks_for_whole_answers(upstream: FakeUpstream) -> None:
    async with proxy(upstream, idle_timeout=None) as (url, _), sdk(url) as client:
        whole = await client.responses.create(model="m", input="whole")
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert (whole.output_text, text) == ("echo: whole", "echo: hi")
    assert all("stream" not in r for r in upstream.requests)


async def test_a_json_answer_is_unchanged_for_clients_that_do_not_stream(
    upstream: FakeUpstream,
) -> None:
    # The proxy streams from its upstream; a client that did not ask gets plain JSON.
    async with proxy(upstream, upstream_stream=True) as (url, _), sdk(url) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert raw.http_response.headers["content-type"].startswith("application/json")
    assert raw.parse().choices[0].message.content == "echo: hi"
