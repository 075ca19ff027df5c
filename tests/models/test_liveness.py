"""The proxy's default: the upstream's whole answer, and a hung upstream still caught.

Against the vLLM-shaped double (``vllm_double``): a double whose streamed tool-call arguments
differ from its whole answer, as vLLM's streaming tool parsers do, gives the whole answer
through the proxy; a double that takes a request and never answers is caught by the liveness
probe as a read timeout, retried and failed over like any model call, while one that answers
its probe keeps generating, and probes never wait for a connection behind the calls they
watch. Then ``LivenessTransport`` alone, in front of a scripted transport.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from rollgym.errors import ConnectError, ReadTimeout
from rollgym.http.default import default_transport
from rollgym.http.lean import LeanTransport
from rollgym.http.transport import RawAnswer, Request
from rollgym.models import proxy as proxy_module
from rollgym.models.liveness import LivenessTransport, Watch, watching
from rollgym.server.base import BaseServer
from rollgym.testing import serve_asgi, serve_server

from .vllm_double import VllmDouble

# Well below every attempt timeout used here (300 s): a hang caught at all is caught by a
# probe, not by the attempt timeout.
pytestmark = pytest.mark.timeout(30)

IDLE = 0.2
ONCE = {"max_attempts": 1}
QUICK = {"backoff_initial": 0.01, "backoff_max": 0.02, "budget": {"enabled": False}}
ECHO = {
    "type": "function",
    "name": "echo",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}
CUT_ARGS = '{"text": "Os'
"""What a streaming tool parser may send for the call ``{"text":"Oslo"}``: not JSON at all."""


@asynccontextmanager
async def served(*doubles: VllmDouble) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        urls = []
        for double in doubles:
            urls.append(await stack.enter_async_context(serve_asgi(double.app)))
            stack.callback(double.release.set)  # first, so that the servers can stop
        yield urls


@asynccontextmanager
async def proxy(*doubles: VllmDouble, **options: Any) -> AsyncIterator[tuple[str, BaseServer]]:
    async with served(*doubles) as urls:
        base: str | list[str] = [u + "/v1" for u in urls] if len(urls) > 1 else urls[0] + "/v1"
        opts = {"base_url": base, "model": "toy", "upstream_retry": QUICK, **options}
        if "upstream_retry" in options:
            opts["upstream_retry"] = {**QUICK, **options["upstream_retry"]}
        async with serve_server("openai_proxy", name="model", options=opts) as (url, server):
            yield url, server


async def post(url: str, body: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=25)) as http,
        http.post(url, json=body) as answer,
    ):
        return answer.status, await answer.json()


def ask(text: str = "weather in Oslo", **extra: Any) -> dict[str, Any]:
    return {"input": text, "tools": [ECHO], **extra}


def calls(response: dict[str, Any]) -> list[str]:
    return [i["arguments"] for i in response["output"] if i["type"] == "function_call"]


# -- the whole answer ------------------------------------------------------------------------


async def test_the_default_gives_the_whole_answer_not_the_streamed_one() -> None:
    double = VllmDouble()
    double.stream_tool_args = CUT_ARGS
    async with proxy(double) as (url, _):
        status, response = await post(url + "/v1/responses", ask())
        assert status == 200, response
        status, completion = await post(
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "weather in Oslo"}], "tools": [
                {"type": "function", "function": {"name": "echo"}}]},
        )  # fmt: skip
    assert calls(response) == ['{"text":"Oslo"}']
    [call] = completion["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"text": "Oslo"}
    assert all("stream" not in r for r in double.requests)  # asked for whole, every time


async def test_a_streaming_client_gets_the_whole_answer_streamed() -> None:
    double = VllmDouble()
    double.stream_tool_args = CUT_ARGS
    body = {
        "messages": [{"role": "user", "content": "weather in Oslo"}],
        "tools": [{"type": "function", "function": {"name": "echo"}}],
        "stream": True,
    }
    async with (
        proxy(double) as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=25)) as http,
        http.post(url + "/v1/chat/completions", json=body) as answer,
    ):
        raw = await answer.text()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line[6:].startswith("{")]
    args = "".join(
        tc["function"].get("arguments", "")
        for e in events
        for choice in e["choices"]
        for tc in choice["delta"].get("tool_calls") or []
    )
    assert json.loads(args) == {"text": "Oslo"}
    assert "stream" not in double.requests[0]


async def test_upstream_stream_opts_in_to_what_the_upstream_streams() -> None:
    # The documented caveat of the opt-in: the streamed arguments, whatever they are.
    double = VllmDouble()
    double.stream_tool_args = CUT_ARGS
    async with proxy(double, upstream_stream=True) as (url, _):
        status, response = await post(url + "/v1/responses", ask())
    assert status == 200, response
    assert calls(response) == [CUT_ARGS]
    assert double.requests[0]["stream"] is True


async def test_token_ids_come_with_the_whole_answer() -> None:
    double = VllmDouble()
    async with proxy(double, return_token_ids=True) as (url, _):
        status, response = await post(url + "/v1/responses", ask())
    assert status == 200, response
    last = response["output"][-1]
    assert last["generation_token_ids"] == double.generated[0]
    assert last["prompt_token_ids"] == double.prompts[0]


# -- a hung upstream -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("stuck", "no answer within 0.2s"),  # a frozen server: its probe hangs too
        ("engine_dead", "answered 503"),  # vLLM's /ping, the default path, reports its engine
    ],
)
async def test_a_replica_that_never_answers_is_caught_as_a_hang(fault: str, problem: str) -> None:
    double = VllmDouble()
    setattr(double, fault, True)
    options = {"idle_timeout": IDLE, "probe_timeout": IDLE, "timeout": 300}  # the default path
    async with proxy(double, upstream_retry=ONCE, **options) as (url, _):
        status, body = await post(url + "/v1/responses", ask())
    assert status == 504, body
    origin = body["error"]["origin"]
    assert origin["type"] == ReadTimeout.type
    assert f"failed its liveness probe (POST /ping: {problem})" in origin["message"]
    assert double.probes >= 1 and len(double.requests) == 1


async def test_a_dead_engine_behind_a_live_server_is_not_seen_by_post_health() -> None:
    # vLLM answers POST /health with 405 whatever its engine: alive, so the call waits on.
    # (That is why the default path is /ping.)
    double = VllmDouble()
    double.engine_dead = True
    options = {"idle_timeout": IDLE, "timeout": 300, "health_path": "/health"}
    async with proxy(double, upstream_retry=ONCE, **options) as (url, _):
        call = asyncio.ensure_future(post(url + "/v1/responses", ask()))
        await double.wait_for_probes(3)
        assert not call.done()
        double.release.set()  # the double then answers 503, as its engine's failure
        status, body = await call
    assert status == 502, body
    assert len(double.requests) == 1


async def test_a_replica_that_answers_its_probe_keeps_generating() -> None:
    double = VllmDouble()
    double.hold_for_probes = 3  # answers only once it was probed three times
    async with proxy(double, idle_timeout=IDLE, timeout=300) as (url, _):
        status, response = await post(url + "/v1/responses", ask())
    assert status == 200, response
    assert calls(response) == ['{"text":"Oslo"}']
    assert len(double.requests) == 1 and double.probes >= 3


async def test_probes_do_not_wait_behind_the_calls_they_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The calls' pool holds two connections, both taken by healthy long generations (they
    # answer once probed twice). A probe that waited for a third would run out its timeout
    # there, and its failure would fail both calls; its own pool answers it at once.
    monkeypatch.setattr(
        proxy_module, "default_transport", functools.partial(default_transport, limit=2)
    )
    double = VllmDouble()
    double.hold_for_probes = 2
    options = {"idle_timeout": IDLE, "probe_timeout": IDLE, "timeout": 300}
    async with proxy(double, upstream_retry=ONCE, **options) as (url, _):
        answers = await asyncio.gather(*(post(url + "/v1/responses", ask()) for _ in range(2)))
    for status, response in answers:
        assert status == 200, response
        assert calls(response) == ['{"text":"Oslo"}']
    assert len(double.requests) == 2 and double.probes >= 2


async def test_a_hang_is_retried_under_the_servers_policy() -> None:
    double = VllmDouble()
    double.stuck_first = 1  # the retry finds the server answering again
    options = {"idle_timeout": IDLE, "probe_timeout": IDLE, "timeout": 300,
               "upstream_retry": {"max_attempts": 2}}  # fmt: skip
    async with proxy(double, **options) as (url, server):
        status, response = await post(url + "/v1/responses", ask())
        stats = server.client.stats()["model.upstream"]
    assert status == 200, response
    assert calls(response) == ['{"text":"Oslo"}']
    assert (len(double.requests), stats.attempts, stats.retries) == (2, 2, 1)


async def test_a_hung_replica_fails_over_and_counts_against_its_breaker() -> None:
    hung, healthy = VllmDouble(), VllmDouble()
    hung.stuck = True
    async with proxy(
        hung, healthy, idle_timeout=IDLE, probe_timeout=IDLE, upstream_retry=ONCE,
        sticky_replicas=False,
    ) as (url, server):  # fmt: skip
        answers = [await post(url + "/v1/responses", ask()) for _ in range(2)]
        stats = server.client.stats()
    assert [status for status, _ in answers] == [200, 200]
    # Ties take turns: the first call tries the hung replica first, the second the other.
    assert (len(hung.requests), len(healthy.requests)) == (1, 2)
    assert stats["model.upstream[0]"].failures == len(hung.requests)


# -- LivenessTransport alone -----------------------------------------------------------------


class Scripted:
    """A transport whose chat answers and probe answers are set by the test."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[RawAnswer] | None = None
        self.probe: asyncio.Future[RawAnswer] | None = None
        self.sent: list[tuple[str, float | None]] = []
        self.cancelled = 0
        self.probed = asyncio.Event()

    async def send(self, request: Request) -> RawAnswer:
        url = request.url
        self.sent.append((url, request.idle_timeout))
        if url.endswith("/health"):
            self.probed.set()
        future = self.probe if url.endswith("/health") else self.answer
        assert future is not None
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def watch(every: float = 0.05, probe_timeout: float = 0.05) -> Watch:
    return Watch("http://up/health", "/health", every, probe_timeout)


async def send(transport: LivenessTransport) -> RawAnswer:
    return await transport.send(
        Request(
            "http://up/v1/chat/completions", b"{}", None, timeout=300, connect_timeout=1,
            server="model.upstream", endpoint="/chat/completions", idle_timeout=IDLE,
        )
    )  # fmt: skip


async def test_without_a_watch_the_inner_transport_is_used_unchanged() -> None:
    inner = Scripted()
    inner.answer = asyncio.get_running_loop().create_future()
    inner.answer.set_result(RawAnswer(200, b"{}"))
    transport = LivenessTransport(inner, probe_transport=inner)
    assert (await send(transport)).status == 200
    assert inner.sent == [("http://up/v1/chat/completions", IDLE)]  # its idle timeout kept
    assert transport.probes == 0


async def test_a_watched_answer_has_no_idle_cut_and_its_probes_are_shared() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch(every=0.01, probe_timeout=20)):
        waiting = [asyncio.ensure_future(send(transport)) for _ in range(5)]
    await inner.probed.wait()
    await asyncio.sleep(0.05)  # every call past its wait, all on the one probe in flight
    assert transport.probes == 1
    inner.probe.set_result(RawAnswer(405, b""))  # alive
    inner.answer.set_result(RawAnswer(200, b"{}"))
    answers = await asyncio.gather(*waiting)
    assert [a.status for a in answers] == [200] * 5
    assert all(idle is None for url, idle in inner.sent if url.endswith("/completions"))


async def test_a_failed_probe_fails_the_attempt_and_cancels_it() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    inner.probe.set_exception(
        ConnectError("cannot connect", server="model.upstream", endpoint="/health")
    )
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch()), pytest.raises(ReadTimeout) as caught:
        await send(transport)
    assert "failed its liveness probe (POST /health: cannot connect)" in caught.value.message
    assert caught.value.endpoint == "/chat/completions"
    assert inner.cancelled == 1  # the attempt's connection is closed


async def test_a_probe_that_hangs_is_bounded_by_its_own_timeout() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()  # neither answers
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch(every=0.05)), pytest.raises(ReadTimeout) as caught:
        await send(transport)
    assert "no answer within 0.05s" in caught.value.message


async def test_a_retry_is_not_failed_by_its_predecessors_probe() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    inner.probe.set_result(RawAnswer(503, b""))
    transport = LivenessTransport(inner, probe_transport=inner, reuse=3600)
    with watching(watch(every=0.01)), pytest.raises(ReadTimeout):
        await send(transport)
    inner.probe = loop.create_future()
    inner.probe.set_result(RawAnswer(200, b""))  # the replica recovered
    inner.answer = loop.create_future()
    inner.probed.clear()
    with watching(watch(every=0.01)):
        attempt = asyncio.ensure_future(send(transport))
    await inner.probed.wait()  # probed anew, not failed on the cached 503
    assert transport.probes == 2 and not attempt.done()
    inner.answer.set_result(RawAnswer(200, b"{}"))
    assert (await attempt).status == 200


async def test_probes_go_through_a_transport_of_their_own() -> None:
    loop = asyncio.get_running_loop()
    chats, probes = Scripted(), Scripted()
    chats.answer, probes.probe = loop.create_future(), loop.create_future()
    probes.probe.set_result(RawAnswer(200, b""))
    transport = LivenessTransport(chats, probe_transport=probes)
    with watching(watch(every=0.01)):
        attempt = asyncio.ensure_future(send(transport))
    await probes.probed.wait()
    chats.answer.set_result(RawAnswer(200, b"{}"))
    assert (await attempt).status == 200
    assert [url for url, _ in chats.sent] == ["http://up/v1/chat/completions"]
    assert {url for url, _ in probes.sent} == {"http://up/health"}
    # By default a pool without a limit, not the watched calls' pool.
    default = LivenessTransport(chats).probe_transport
    assert isinstance(default, LeanTransport) and default.limit == 0
