"""The proxy's default: the upstream's whole answer, and a hung upstream still caught.

Against the vLLM-shaped double (``vllm_double``): a double whose streamed tool-call arguments
differ from its whole answer, as vLLM's streaming tool parsers do, gives the whole answer
through the proxy; a double that takes requests and never answers fails every call in flight
there from one heartbeat probe, as ``replica_down``, not retried on it, its breaker opened and
new calls refused naming the cause, or failed over to another replica; an engine whose counters
stand still is ``replica_stalled``, while a slow generation whose counters move, or one that
answers its probe, keeps generating; probes never wait for a connection behind the calls they
watch; a call a live upstream lost is hedged. Then ``LivenessTransport`` alone, in front of a
scripted transport, and the pure parts (metrics, latencies, the hedge budget).
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

from rollgym.errors import CircuitOpen, ConnectError, ReplicaDown, ReplicaStalled
from rollgym.http.breaker import CLOSED, OPEN
from rollgym.http.default import default_transport
from rollgym.http.lean import LeanTransport
from rollgym.http.transport import RawAnswer, Request
from rollgym.models import proxy as proxy_module
from rollgym.models.hedge import HedgeBudget, Latencies, size_bucket
from rollgym.models.liveness import LivenessTransport, Watch, watching
from rollgym.models.progress import Progress, Reading, read_metrics
from rollgym.server.base import BaseServer
from rollgym.testing import serve_asgi, serve_server

from .vllm_double import VllmDouble

# Well below every attempt timeout used here (300 s): a hang caught at all is caught by a
# probe, not by the attempt timeout.
pytestmark = pytest.mark.timeout(30)

IDLE = 0.2
BEAT = {"heartbeat": IDLE, "probe_timeout": IDLE, "timeout": 300}
"""A heartbeat and probe of 0.2 s; the attempt timeout far away."""
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
async def test_a_replica_that_never_answers_is_caught_and_not_retried(
    fault: str, problem: str
) -> None:
    double = VllmDouble()
    setattr(double, fault, True)
    # The default policy: three attempts; a replica found down takes none of the other two.
    async with proxy(double, **BEAT) as (url, server):
        status, body = await post(url + "/v1/responses", ask())
        breaker = server.client.breaker("model.upstream")
    assert status == 504, body
    origin = body["error"]["origin"]
    assert origin["type"] == ReplicaDown.type
    assert f"failed its liveness probe (POST /ping: {problem})" in origin["message"]
    assert origin["attempts"] == 1 and len(double.requests) == 1
    assert breaker is not None and breaker.state == OPEN
    assert breaker.reason == f"POST /ping: {problem}"


async def test_one_probe_fails_every_call_in_flight_and_the_next_is_refused() -> None:
    double = VllmDouble()
    double.stuck = True
    calls = 20
    async with proxy(double, **BEAT) as (url, server):
        answers = await asyncio.gather(*(post(url + "/v1/responses", ask()) for _ in range(calls)))
        status, refused = await post(url + "/v1/responses", ask())
        downs = server.liveness.downs
    assert [a[0] for a in answers] == [504] * calls
    assert {a[1]["error"]["origin"]["type"] for a in answers} == {ReplicaDown.type}
    assert downs == 1  # one heartbeat failed them all
    assert len(double.requests) == calls  # none sent twice
    # The breaker refuses the next call without sending it, and says why it opened.
    assert status == 502, refused
    origin = refused["error"]["origin"]
    assert origin["type"] == CircuitOpen.type
    assert "POST /ping: no answer within 0.2s" in origin["message"]
    assert len(double.requests) == calls


async def test_a_replica_found_down_comes_back_through_its_breakers_probe() -> None:
    double = VllmDouble()
    double.stuck_first = 1  # frozen while its first request is the latest
    retry = {"breaker": {"cooldown": 0.05}}
    async with proxy(double, upstream_retry=retry, **BEAT) as (url, server):
        status, body = await post(url + "/v1/responses", ask())
        assert status == 504 and body["error"]["origin"]["type"] == ReplicaDown.type
        await asyncio.sleep(0.1)  # past the cooldown: the next call is the breaker's probe
        status, response = await post(url + "/v1/responses", ask())
        breaker = server.client.breaker("model.upstream")
    assert status == 200, response
    assert breaker is not None and breaker.state == CLOSED


async def test_a_dead_engine_behind_a_live_server_is_not_seen_by_post_health() -> None:
    # vLLM answers POST /health with 405 whatever its engine: alive, so the call waits on.
    # (That is why the default path is /ping.)
    double = VllmDouble()
    double.engine_dead = True
    options = {**BEAT, "probe_timeout": 10, "health_path": "/health", "metrics_path": None}
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
    async with proxy(double, **{**BEAT, "probe_timeout": 10}) as (url, _):
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
    async with proxy(double, upstream_retry=ONCE, **BEAT) as (url, _):
        answers = await asyncio.gather(*(post(url + "/v1/responses", ask()) for _ in range(2)))
    for status, response in answers:
        assert status == 200, response
        assert calls(response) == ['{"text":"Oslo"}']
    assert len(double.requests) == 2 and double.probes >= 2


async def test_a_hung_replica_fails_over_and_its_breaker_opens() -> None:
    hung, healthy = VllmDouble(), VllmDouble()
    hung.stuck = True
    async with proxy(hung, healthy, sticky_replicas=False, **BEAT) as (url, server):
        answers = [await post(url + "/v1/responses", ask()) for _ in range(2)]
        breakers = server.client.breakers("model.upstream[0]")
    assert [status for status, _ in answers] == [200, 200]
    # Ties take turns: the first call tries the hung replica first; its breaker then keeps
    # the second call away from it.
    assert (len(hung.requests), len(healthy.requests)) == (1, 2)
    assert [b.state for b in breakers] == [OPEN]


async def test_a_failed_probe_does_not_cut_a_generation_whose_counters_move() -> None:
    # /ping too slow to answer within its timeout, while the engine generates: the counters
    # say the replica is alive, so the call completes and the misses are only counted.
    double = VllmDouble()
    double.slow_probes = True
    double.generate_seconds = 2.0  # several beats, its counter moving token by token
    async with proxy(double, upstream_retry=ONCE, **BEAT) as (url, server):
        status, response = await post(url + "/v1/responses", ask())
        downs, misses = server.liveness.downs, server.liveness.probe_misses
    assert status == 200, response
    assert calls(response) == ['{"text":"Oslo"}']
    assert downs == 0 and misses >= 2 and len(double.requests) == 1


async def test_failed_probes_with_counters_standing_still_are_a_replica_down() -> None:
    # The same slow /ping, but the engine generates nothing: two failed probes in a row
    # (the first has no earlier reading to compare with) and the replica is down.
    double = VllmDouble()
    double.slow_probes = True
    double.engine_stalled = True
    async with proxy(double, **BEAT) as (url, server):
        status, body = await post(url + "/v1/responses", ask())
        misses = server.liveness.probe_misses
    assert status == 504, body
    origin = body["error"]["origin"]
    assert origin["type"] == ReplicaDown.type
    assert "failed its liveness probe (POST /ping: no answer within 0.2s)" in origin["message"]
    assert misses == 1 and origin["attempts"] == 1


# -- an engine that makes no progress --------------------------------------------------------


async def test_an_engine_that_stops_generating_is_typed_as_stalled() -> None:
    double = VllmDouble()
    double.engine_stalled = True  # /ping answers 200 throughout
    async with proxy(double, stall_timeout=0.6, **BEAT) as (url, server):
        status, body = await post(url + "/v1/responses", ask())
        breaker = server.client.breaker("model.upstream")
    assert status == 504, body
    origin = body["error"]["origin"]
    assert origin["type"] == ReplicaStalled.type
    assert "made no progress" in origin["message"]
    assert "token counters at GET /metrics stood still" in origin["message"]
    assert len(double.requests) == 1 and double.scrapes >= 2
    assert breaker is not None and breaker.state == OPEN


async def test_an_engine_stopped_while_idle_is_typed_as_stalled() -> None:
    # As a real vLLM 0.32 whose EngineCore was SIGSTOPped between calls: /ping answers 200,
    # /metrics what the engine last reported (idle, counters still), and a call sent then
    # never reaches the engine. Its gauges say idle, but not one call was started since.
    double = VllmDouble()
    async with proxy(double, stall_timeout=0.6, **BEAT) as (url, server):
        status, _ = await post(url + "/v1/responses", ask())
        assert status == 200  # the engine moved its counters, then went idle
        double.engine_stopped = True
        status, body = await post(url + "/v1/responses", ask())
        breaker = server.client.breaker("model.upstream")
    assert status == 504, body
    origin = body["error"]["origin"]
    assert origin["type"] == ReplicaStalled.type
    assert "none in its engine by its last report" in origin["message"]
    assert len(double.requests) == 2 and double.running == 0
    assert breaker is not None and breaker.state == OPEN


async def test_a_frozen_engine_is_stalled_while_another_engine_progresses() -> None:
    # vLLM data-parallel: engine 0 holds the calls and generates nothing, engine 1 serves
    # other clients; the replica's sum moves at every scrape, engine 0's counters do not.
    double = VllmDouble()
    double.engines = 2
    double.engine_stalled = True
    options = {**BEAT, "timeout": 10, "stall_timeout": 0.6, "upstream_retry": ONCE}
    async with proxy(double, **options) as (url, _):
        answers = await asyncio.gather(*(post(url + "/v1/responses", ask()) for _ in range(3)))
    for status, body in answers:
        assert status == 504, body
        origin = body["error"]["origin"]
        assert origin["type"] == ReplicaStalled.type, origin
        assert "of engine 0, holding 3" in origin["message"]


async def test_a_slow_generation_that_progresses_is_never_cut() -> None:
    double = VllmDouble()
    double.generate_seconds = 3.0  # five times the stall timeout, its counter moving
    async with proxy(double, stall_timeout=0.6, **BEAT) as (url, server):
        status, response = await post(url + "/v1/responses", ask())
        downs = server.liveness.downs
    assert status == 200, response
    assert calls(response) == ['{"text":"Oslo"}']
    assert downs == 0 and len(double.requests) == 1 and double.scrapes >= 5


async def test_an_upstream_without_metrics_is_not_watched_for_progress() -> None:
    double = VllmDouble()
    double.engine_stalled = True
    double.metrics = False  # /metrics answers 404, as OpenAI's API would
    async with proxy(double, stall_timeout=0.3, **BEAT) as (url, server):
        call = asyncio.ensure_future(post(url + "/v1/responses", ask()))
        await double.wait_for_probes(6)  # well past the stall timeout
        assert not call.done() and server.liveness.downs == 0
        double.release.set()
        status, response = await call
    assert status == 200, response
    assert double.scrapes == 1  # asked once; a 404 is an answer for good


# -- a call a live upstream lost -------------------------------------------------------------


async def test_a_lost_call_is_hedged_and_the_first_answer_wins() -> None:
    double = VllmDouble()
    double.lose = {4}  # the fourth request is taken and never answered
    async with proxy(double, **BEAT) as (url, server):
        # A small sample and floor, every call hedgeable: the rules, faster.
        server.liveness.latencies = Latencies(min_seconds=0.3, min_samples=3)
        server.liveness.budget = HedgeBudget(share=1.0)
        for _ in range(3):
            status, _ = await post(url + "/v1/responses", ask())
            assert status == 200
        status, response = await post(url + "/v1/responses", ask())
        hedges = server.liveness.hedges
    assert status == 200, response
    assert calls(response) == ['{"text":"Oslo"}']
    assert response["rollgym_upstream"]["rollgym_hedged"] == 1
    assert hedges == 1 and len(double.requests) == 5


async def test_a_lost_call_is_hedged_at_a_low_call_rate() -> None:
    # Four calls in the budget's window: 5% of them is no hedge at all; one hedge in flight
    # per replica is allowed whatever the rate.
    double = VllmDouble()
    double.lose = {4}
    async with proxy(double, upstream_retry=ONCE, **{**BEAT, "timeout": 10}) as (url, server):
        server.liveness.latencies = Latencies(min_seconds=0.3, min_samples=3)
        for _ in range(3):
            status, _ = await post(url + "/v1/responses", ask())
            assert status == 200
        status, response = await post(url + "/v1/responses", ask())
        hedges = server.liveness.hedges
    assert status == 200, response
    assert response["rollgym_upstream"]["rollgym_hedged"] == 1
    assert hedges == 1 and len(double.requests) == 5


async def test_no_hedge_before_the_replica_has_answered_enough_calls() -> None:
    double = VllmDouble()
    double.hold_for_probes = 4
    async with proxy(double, **BEAT) as (url, server):
        server.liveness.latencies = Latencies(min_seconds=0.01, min_samples=3)
        status, response = await post(url + "/v1/responses", ask())
    assert status == 200, response
    assert server.liveness.hedges == 0 and len(double.requests) == 1
    assert "rollgym_hedged" not in response["rollgym_upstream"]


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


async def test_one_heartbeat_watches_every_call_and_has_no_idle_cut() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch(every=0.01, probe_timeout=20)):
        waiting = [asyncio.ensure_future(send(transport)) for _ in range(5)]
    await inner.probed.wait()
    await asyncio.sleep(0.05)  # every call waiting, one probe in flight for them all
    assert transport.probes == 1
    inner.probe.set_result(RawAnswer(405, b""))  # alive
    inner.answer.set_result(RawAnswer(200, b"{}"))
    answers = await asyncio.gather(*waiting)
    assert [a.status for a in answers] == [200] * 5
    assert all(idle is None for url, idle in inner.sent if url.endswith("/completions"))


async def test_a_failed_probe_fails_every_attempt_after_telling_on_down() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    inner.probe.set_exception(
        ConnectError("cannot connect", server="model.upstream", endpoint="/health")
    )
    told: list[str] = []
    transport = LivenessTransport(
        inner, probe_transport=inner, on_down=lambda w, why, err: told.append(why)
    )
    with watching(watch()):
        attempts = [asyncio.ensure_future(send(transport)) for _ in range(3)]
    failed = await asyncio.gather(*attempts, return_exceptions=True)
    assert all(isinstance(err, ReplicaDown) for err in failed)
    err = failed[0]
    assert isinstance(err, ReplicaDown) and not err.retryable
    assert "failed its liveness probe (POST /health: cannot connect)" in err.message
    assert err.endpoint == "/chat/completions"
    assert told == ["POST /health: cannot connect"]
    assert inner.cancelled == 3  # each attempt's connection is closed
    assert transport.downs == 1


async def test_a_probe_that_hangs_is_bounded_by_its_own_timeout() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()  # neither answers
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch(every=0.05)), pytest.raises(ReplicaDown) as caught:
        await send(transport)
    assert "no answer within 0.05s" in caught.value.message


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


async def test_the_heartbeat_stops_when_nothing_is_in_flight() -> None:
    loop = asyncio.get_running_loop()
    inner = Scripted()
    inner.answer, inner.probe = loop.create_future(), loop.create_future()
    inner.probe.set_result(RawAnswer(200, b""))
    transport = LivenessTransport(inner, probe_transport=inner)
    with watching(watch(every=0.01)):
        attempt = asyncio.ensure_future(send(transport))
    await inner.probed.wait()
    inner.answer.set_result(RawAnswer(200, b"{}"))
    await attempt
    probes = transport.probes
    await asyncio.sleep(0.1)  # ten heartbeats' time, nothing in flight
    assert transport.probes == probes


# -- the pure parts --------------------------------------------------------------------------

VLLM_METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 120.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e+09
vllm:prompt_tokens_total{engine="0",model_name="m"} 30.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
"""
SGLANG_METRICS = """# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 7.557572e+06
sglang:prompt_tokens_total{model_name="m"} 8.128902e+06
sglang:num_running_reqs{model_name="m"} 0.0
"""


def test_metrics_are_read_from_vllm_and_sglang_expositions() -> None:
    engines = (("0", 150.0, 3.0), ("1", 0.0, 1.0))
    assert read_metrics(VLLM_METRICS) == Reading(150.0, 4.0, engines)
    assert read_metrics(SGLANG_METRICS) == Reading(7.557572e06 + 8.128902e06, 0.0)
    assert read_metrics("# nothing\nprocess_cpu_seconds_total 3.0\n") is None
    assert read_metrics("vllm:prompt_tokens_total 5\n") == Reading(5.0, None)


def test_progress_is_stalled_only_with_work_in_the_engine() -> None:
    progress = Progress(stall_timeout=10)
    progress.restart(0)
    assert progress.stalled(Reading(5, 1), 1) is None
    assert progress.stalled(Reading(5, 1), 9) is None
    assert progress.stalled(Reading(5, 1), 11) == 10  # stood still since t=1
    assert progress.stalled(Reading(6, 1), 30) is None  # moved
    assert progress.stalled(Reading(6, 0), 50) is None  # an idle engine is not stalled
    assert progress.stalled(Reading(6, None), 55) is None  # ... and its idle time not counted
    assert progress.stalled(Reading(6, None), 61) == 11


def test_one_engine_holding_requests_with_its_counters_still_is_a_stall() -> None:
    progress = Progress(stall_timeout=10)
    progress.restart(0)

    def reading(frozen: float, other: float) -> Reading:
        return Reading(frozen + other, 4, (("0", frozen, 3), ("1", other, 1)))

    assert progress.stalled(reading(5, 100), 1) is None
    assert progress.stalled(reading(5, 200), 9) is None
    assert progress.stalled(reading(5, 300), 12) == 11  # engine 0 still since t=1
    assert progress.engine == "0"
    progress.restart(20)
    # An idle engine's stillness is no stall, whatever the others do.
    idle = Reading(305, 1, (("0", 5, 0), ("1", 300, 1)))
    assert progress.stalled(idle, 21) is None
    assert progress.stalled(Reading(405, 1, (("0", 5, 0), ("1", 400, 1))), 40) is None


def test_an_idle_engine_that_took_no_call_sent_since_it_last_moved_is_stalled() -> None:
    # A stopped engine's gauges say what it last reported (idle, for one stopped between
    # calls): a call that waited stall_timeout since it was sent, with the counters standing
    # still since before it, never reached the engine.
    progress = Progress(stall_timeout=10)
    progress.restart(0)
    assert progress.stalled(Reading(5, 0), 5, [0]) is None
    assert progress.stalled(Reading(5, 0), 9, [0]) is None
    assert progress.stalled(Reading(5, 0), 11, [0]) == 11
    # A call sent before the counters last moved is a lost call (the hedge's), not a stall.
    progress.restart(20)
    assert progress.stalled(Reading(7, 0), 25, [20]) is None  # moved since the last reading
    assert progress.stalled(Reading(7, 0), 40, [20]) is None
    # ... but one sent after that, which waited stall_timeout, never reached the engine.
    assert progress.stalled(Reading(7, 0), 50, [20, 41]) is None  # 9 s since 41
    assert progress.stalled(Reading(7, 0), 52, [20, 41]) == 11


def test_hedges_wait_for_enough_answers_of_the_size_and_stay_within_their_share() -> None:
    latencies = Latencies(factor=4, min_seconds=1, min_samples=3)
    small, large = (7, 4), (12, 4)
    assert latencies.hedge_after("r", small) is None
    for seconds in (0.5, 0.5, 2.0):
        latencies.add("r", small, seconds)
    assert latencies.hedge_after("r", small) == 8.0  # 4 x the 95th percentile
    assert latencies.hedge_after("r", large) == 8.0  # too few of its own: the replica's
    for _ in range(3):
        latencies.add("r", large, 30.0)
    assert latencies.hedge_after("r", large) == 120.0
    assert latencies.hedge_after("other", small) is None

    now = [0.0]
    budget = HedgeBudget(share=0.05, window=60, clock=lambda: now[0])
    for _ in range(19):
        budget.note_call()
    assert not budget.try_hedge()  # 1 > 5% of 19
    budget.note_call()
    assert budget.try_hedge() and not budget.try_hedge()
    now[0] = 61.0  # the window moved on: nothing counted
    assert not budget.try_hedge()
    # Whatever the rate, one hedge in flight per replica.
    assert budget.try_hedge("r") and not budget.try_hedge("r")
    assert budget.try_hedge("s")
    budget.finished("r")
    assert budget.try_hedge("r")


def test_a_calls_size_is_its_max_tokens_and_prompt_length() -> None:
    short = {"messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 512}
    assert size_bucket(short) == (9, 7)
    assert size_bucket({"messages": [{"role": "user", "content": "hi"}]}) == (-1, 1)
    assert size_bucket({"max_completion_tokens": 1000, "messages": "junk"}) == (10, 0)
