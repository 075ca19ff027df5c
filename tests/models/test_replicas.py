"""``openai_proxy`` in front of several vLLM-shaped replicas (``base_url`` as a list), all served
for real on 127.0.0.1: least-outstanding spread, a breaker per replica, failover, stickiness of
a rollout's calls, and ``/tokenize`` on the replica that generated."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from starlette.responses import JSONResponse

from rollgym.config import BreakerConfig
from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    DeadlineExceeded,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
)
from rollgym.http import Target
from rollgym.http.breaker import CircuitBreaker
from rollgym.models.proxy import OpenAIProxy
from rollgym.models.replicas import Replicas, fails_over, replica_targets
from rollgym.testing import serve_asgi, serve_server
from rollgym.wire import HEADER_ROLLOUT
from tests.support.servers import port_of, refused_url
from tests.support.stack import ECHO_TOOL, fast_policy
from tests.support.waiting import wait_until

from .test_proxy import make_proxy
from .vllm_double import VllmDouble

pytestmark = pytest.mark.timeout(60)

QUICK = {"backoff_initial": 0.01, "backoff_max": 0.02, "budget": {"enabled": False}}


class Upstream:
    """One replica: a ``VllmDouble`` that can be slowed down or made to answer an error status;
    it counts every request it gets (``hits``), answered or not."""

    def __init__(self, **double: Any) -> None:
        self.double = VllmDouble(**double)
        self.double.tool_turns = 3
        self.delay = 0.0
        self.status: int | None = None
        self.hits = 0
        self.url = ""

        # A plain function: uvicorn takes a bound method for an ASGI2 app.
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.hits += 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.status is not None:
                    error = {"error": {"message": "replica unavailable", "code": self.status}}
                    await JSONResponse(error, status_code=self.status)(scope, receive, send)
                    return
            await self.double.app(scope, receive, send)

        self.app = app

    @property
    def chats(self) -> list[dict[str, Any]]:
        return self.double.requests


@dataclass
class Stack:
    upstreams: list[Upstream]
    stops: list[AsyncExitStack]
    """Closing ``stops[i]`` stops replica i's server: its connections are refused from then
    on (its port held, so that no other process takes it and answers)."""
    proxy_url: str
    proxy: OpenAIProxy
    agent_url: str = ""

    def breaker_states(self) -> list[str]:
        states = []
        for i in range(len(self.upstreams)):
            breaker = self.proxy.client.breaker(f"model.upstream[{i}]")
            states.append("closed" if breaker is None else breaker.state)
        return states


@asynccontextmanager
async def replicated(
    n: int = 3, *, agent: bool = False, breaker: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[Stack]:
    """``n`` replicas, the proxy in front of them, and with ``agent`` the tool agent and the
    echo environment too."""
    new_vllm = options.pop("new_vllm", True)
    upstreams = [Upstream(new_vllm=new_vllm) for _ in range(n)]
    async with AsyncExitStack() as outer:
        held = outer.enter_context(ExitStack())  # entered first: released after every stop
        stops = []
        for upstream in upstreams:
            stop = AsyncExitStack()
            # Called once the server entered below has stopped, at once: its port is held
            # from then on, refusing connections, until the test ends.
            stop.callback(lambda u=upstream: held.enter_context(refused_url(port_of(u.url))))
            upstream.url = await stop.enter_async_context(serve_asgi(upstream.app))
            outer.push_async_callback(stop.aclose)  # a no-op for a replica already stopped
            stops.append(stop)
        retry = {**QUICK, "breaker": breaker or {"enabled": False}}
        opts = {
            "base_url": [u.url + "/v1" for u in upstreams],
            "model": "toy",
            "upstream_retry": retry,
            **options,
        }
        url, server = await outer.enter_async_context(
            serve_server("openai_proxy", name="model", options=opts)
        )
        assert isinstance(server, OpenAIProxy)
        stack = Stack(upstreams, stops, url, server)
        if agent:
            env_url, _ = await outer.enter_async_context(serve_server("echo", name="env"))
            peers = {
                "model": Target.single("model", url, fast_policy("model")),
                "env": Target.single("env", env_url, fast_policy("resources")),
            }
            agent_opts = {"model": "model", "resources": "env"}
            agent_server = serve_server("tool_agent", name="agent", options=agent_opts, peers=peers)
            stack.agent_url, _ = await outer.enter_async_context(agent_server)
        yield stack


async def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(url, json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


async def respond(stack: Stack, text: str = "hi", rollout: str | None = None) -> Any:
    headers = {HEADER_ROLLOUT: rollout} if rollout else None
    status, body = await post(stack.proxy_url + "/v1/responses", {"input": text}, headers)
    assert status == 200, body
    return body


async def run_rollout(stack: Stack, n: int) -> dict[str, Any]:
    row = {
        "responses_create_params": {"input": f"please echo w{n}", "tools": [ECHO_TOOL]},
        "expected_answer": f"w{n}",
    }
    status, verified = await post(stack.agent_url + "/run", row, {HEADER_ROLLOUT: f"{n}:0"})
    assert status == 200, verified
    return dict(verified)


def rollout_of(chat: dict[str, Any]) -> str:
    """The rollout a chat request belongs to: its first user message ends with ``wN``."""
    first = next(m["content"] for m in chat["messages"] if m["role"] == "user")
    return str(first.split()[-1])


def replicas_per_rollout(stack: Stack) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = {}
    for i, upstream in enumerate(stack.upstreams):
        for chat in upstream.chats:
            seen.setdefault(rollout_of(chat), set()).add(i)
    return seen


# -- balancing ---------------------------------------------------------------------------------


async def test_concurrent_calls_spread_evenly_and_a_slow_replica_gets_fewer() -> None:
    async with replicated(3) as stack:
        for upstream in stack.upstreams:
            upstream.delay = 0.05
        await asyncio.gather(*(respond(stack, f"q{i}") for i in range(30)))
        even = [len(u.chats) for u in stack.upstreams]
        assert sum(even) == 30 and all(8 <= c <= 12 for c in even), even

        # Replica 0 answers in 0.5 s, the others at once: while it holds a call, the least
        # outstanding replica is another one.
        stack.upstreams[0].delay = 0.5
        for upstream in stack.upstreams[1:]:
            upstream.delay = 0.0
        before = [len(u.chats) for u in stack.upstreams]

        async def worker(w: int) -> None:
            for i in range(8):
                await respond(stack, f"w{w}-{i}")

        await asyncio.gather(*(worker(w) for w in range(6)))
        got = [len(u.chats) - b for u, b in zip(stack.upstreams, before, strict=True)]
        assert sum(got) == 48
        assert got[0] * 3 < min(got[1:]), got
        assert stack.proxy.replicas.outstanding() == [0, 0, 0]


# -- failure and failover ----------------------------------------------------------------------


async def test_a_replica_stopped_mid_run_fails_no_rollout_and_opens_only_its_breaker() -> None:
    breaker = {"consecutive_failures": 2, "cooldown": 60}
    async with replicated(3, agent=True, breaker=breaker) as stack:
        for upstream in stack.upstreams:
            upstream.delay = 0.05

        async def stop_replica_1() -> None:
            # Once rollouts have started there (some stick to it), take it away for good.
            await wait_until(lambda: len(stack.upstreams[1].chats) >= 2, what="calls on replica 1")
            await stack.stops[1].aclose()

        results = await asyncio.gather(
            *(run_rollout(stack, n) for n in range(12)), stop_replica_1()
        )
        verified = results[:12]
        assert all(v["reward"] == 1.0 for v in verified)  # every rollout finished, and right
        stats = stack.proxy.client.stats()
        assert stats["model.upstream[1]"].failures >= 2
        assert stack.breaker_states() == ["closed", "open", "closed"]
        # Each rollout ran all its turns even though some began on the stopped replica.
        assert all(len(v["response"]["output"]) == 7 for v in verified)

        # With its breaker open, the replica is not even tried.
        calls = stats["model.upstream[1]"].calls
        await asyncio.gather(*(run_rollout(stack, n) for n in range(12, 16)))
        assert stack.proxy.client.stats()["model.upstream[1]"].calls == calls


async def test_a_failing_replica_is_routed_around_then_probed_back_after_cooldown() -> None:
    # A cooldown longer than the 13 calls below take on a busy machine: none of them may find
    # the breaker half-open (it would probe the sick replica and count a hit).
    breaker = {"consecutive_failures": 2, "cooldown": 3.0}
    async with replicated(3, breaker=breaker) as stack:
        sick = stack.upstreams[0]
        sick.status = 503
        for i in range(9):
            answer = await respond(stack, f"q{i}")  # each call still succeeds, elsewhere
            assert answer["output"][-1]["content"][0]["text"] == f"The answer is q{i}"
        assert stack.breaker_states() == ["open", "closed", "closed"]
        # The two calls that opened it made 3 attempts each (its own retries), then moved on.
        assert sick.hits == 6 and sick.chats == []

        for i in range(4):  # open: no calls, not even one the client refuses unsent
            await respond(stack, f"r{i}")
        assert sick.hits == 6
        stats = stack.proxy.client.stats()["model.upstream[0]"]
        assert (stats.calls, stats.failures, stats.circuit_rejected) == (2, 2, 0)

        sick.status = None  # back to health; after the cooldown the next call probes it
        await asyncio.sleep(3.1)  # past the cooldown (a lower bound: load only adds)
        await respond(stack, "probe")
        assert [c["messages"][-1]["content"] for c in sick.chats] == ["probe"]
        assert stack.breaker_states() == ["closed", "closed", "closed"]
        await asyncio.gather(*(respond(stack, f"s{i}") for i in range(6)))
        assert len(sick.chats) >= 2  # it takes its share again


async def test_a_4xx_goes_to_no_other_replica_and_5xx_tries_each_once() -> None:
    async with replicated(3) as stack:
        for upstream in stack.upstreams:
            upstream.status = 400
        status, body = await post(stack.proxy_url + "/v1/responses", {"input": "bad"})
        assert status == 502
        origin = body["error"]["origin"]
        assert (origin["type"], origin["status"]) == ("http_status", 400)
        assert origin["server"].startswith("model.upstream[")
        # The caller's mistake: not retried, and sent to one replica only.
        assert [u.hits for u in stack.upstreams].count(1) == 1
        assert sum(u.hits for u in stack.upstreams) == 1

        for upstream in stack.upstreams:
            upstream.status, upstream.hits = 503, 0
        status, body = await post(stack.proxy_url + "/v1/responses", {"input": "down"})
        assert status == 502
        origin = body["error"]["origin"]
        assert (origin["status"], origin["attempts"]) == (503, 3)
        # Each replica once, with its own retries; the last one's error is the answer.
        assert [u.hits for u in stack.upstreams] == [3, 3, 3]


# -- stickiness --------------------------------------------------------------------------------


@pytest.mark.parametrize("sticky", [True, False], ids=["sticky", "not_sticky"])
async def test_a_rollouts_turns_stay_on_one_replica_when_sticky(sticky: bool) -> None:
    async with replicated(3, agent=True, sticky_replicas=sticky) as stack:
        alone = await run_rollout(stack, 0)  # nothing else in flight: each turn free to go
        assert alone["reward"] == 1.0
        first = replicas_per_rollout(stack)["w0"]
        assert sum(len(u.chats) for u in stack.upstreams) == 4  # 3 tool calls, then the answer
        if sticky:
            assert len(first) == 1
            assert stack.proxy.replicas.home("0:0") in first
        else:
            assert len(first) == 3  # ties take turns: consecutive calls spread

        verified = await asyncio.gather(*(run_rollout(stack, n) for n in range(1, 10)))
        assert all(v["reward"] == 1.0 for v in verified)
        spans = replicas_per_rollout(stack)
        if sticky:
            assert all(len(s) == 1 for s in spans.values()), spans
            # Sticky, yet balanced: new rollouts start on the least loaded replica.
            assert len(set().union(*spans.values())) == 3
        else:
            assert all(stack.proxy.replicas.home(f"{n}:0") is None for n in range(10))


async def test_a_sticky_rollout_moves_when_its_replica_fails_and_sticks_there() -> None:
    breaker = {"consecutive_failures": 1, "cooldown": 60}
    async with replicated(2, breaker=breaker) as stack:
        await respond(stack, "one", rollout="7:0")
        home = stack.proxy.replicas.home("7:0")
        assert home is not None
        stack.upstreams[home].status = 503
        for turn in ("two", "three", "four"):
            await respond(stack, turn, rollout="7:0")
        other = 1 - home
        assert stack.proxy.replicas.home("7:0") == other
        assert [c["messages"][-1]["content"] for c in stack.upstreams[other].chats] == [
            "two",
            "three",
            "four",
        ]
        assert stack.upstreams[home].hits == 4  # "one", then "two"'s three attempts


# -- token data ----------------------------------------------------------------------------------


async def test_tokenize_goes_to_the_replica_that_generated() -> None:
    # An older vLLM: no prompt_token_ids, so each call's prompt is rendered with /tokenize.
    async with replicated(3, agent=True, new_vllm=False, return_token_ids=True) as stack:
        verified = await asyncio.gather(*(run_rollout(stack, n) for n in range(6)))
        assert all(v["reward"] == 1.0 for v in verified)
        total = 0
        for upstream in stack.upstreams:
            chats = sorted(json.dumps(c["messages"]) for c in upstream.chats)
            rendered = sorted(json.dumps(t["messages"]) for t in upstream.double.tokenize_requests)
            assert chats == rendered  # every call tokenized where it was generated, only there
            total += len(chats)
        assert total == 24
        for v in verified:
            items = [i for i in v["response"]["output"] if "prompt_token_ids" in i]
            assert len(items) == 4 and v["drifted_turns"] == 0


async def test_the_tokenize_route_goes_to_a_replicas_root() -> None:
    async with replicated(2) as stack:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        for _ in range(4):
            status, answer = await post(stack.proxy_url + "/tokenize", body)
            assert status == 200 and answer["count"] == len(answer["tokens"])
        assert [len(u.double.tokenize_requests) for u in stack.upstreams] == [2, 2]


# -- options -----------------------------------------------------------------------------------


def test_replica_names_and_a_single_url_keeps_its_old_names() -> None:
    server = make_proxy(base_url=["http://a:8000/v1/", "http://b:8000/v1"])
    names = [(r.chat.name, r.root.name, r.root.urls) for r in server.replicas.all]
    assert names == [
        ("model.upstream[0]", "model.upstream_root[0]", ("http://a:8000",)),
        ("model.upstream[1]", "model.upstream_root[1]", ("http://b:8000",)),
    ]
    [one] = make_proxy(base_url=["http://a:8000/v1"]).replicas.all
    assert (one.chat.name, one.root.name) == ("model.upstream", "model.upstream_root")


@pytest.mark.parametrize(
    ("base_url", "needle"),
    [
        ([], "at least one upstream URL"),
        (["http://a/v1", "b:8000/v1"], "item 1: the upstream's URL is required"),
        (["http://a/v1", "http://a/v1/"], "http://a/v1 is listed twice"),
    ],
)
def test_bad_replica_lists_are_config_errors(base_url: list[str], needle: str) -> None:
    from rollgym.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        make_proxy(base_url=base_url)
    assert needle in info.value.message and "servers.model.options.base_url" in info.value.message


def test_credentials_in_any_replica_url_with_an_api_key_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollgym.errors import ConfigError

    monkeypatch.setenv("ROLLGYM_TEST_REPLICA_KEY", "a-key-value-123")
    urls = ["http://a/v1", "http://user:hunter22@b/v1"]
    with pytest.raises(ConfigError) as info:
        make_proxy(base_url=urls, api_key_env="ROLLGYM_TEST_REPLICA_KEY")
    assert "api_key_env" in info.value.message and "hunter22" not in info.value.message


# -- the choice itself, without a network -------------------------------------------------------


def test_which_errors_fail_over() -> None:
    def status(code: int) -> HTTPStatusError:
        return HTTPStatusError("x", status=code, server="model.upstream[0]")

    assert fails_over(status(503)) and fails_over(status(500))
    assert not fails_over(status(400)) and not fails_over(status(429))
    assert fails_over(ConnectError("x")) and fails_over(ReadTimeout("x"))
    assert fails_over(ProtocolError("x")) and fails_over(CircuitOpen("x"))
    assert fails_over(BudgetExhausted("x", origin=status(503)))
    assert not fails_over(BudgetExhausted("x", origin=status(409)))
    assert not fails_over(DeadlineExceeded("x", origin=ReadTimeout("x")))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_open_breaker_is_skipped_until_its_cooldown_then_probed_first() -> None:
    clock = Clock()
    targets = replica_targets("m", ["http://a/v1", "http://b/v1"], fast_policy("model"))
    config = BreakerConfig(consecutive_failures=1, cooldown=5)
    breakers = {t.chat.name: CircuitBreaker(t.chat.name, config, clock) for t in targets}
    replicas = Replicas(targets, breakers.get, deadline=10, clock=clock)
    breakers["m.upstream[0]"].record(False)  # opens
    assert [r.index for r in replicas.order(None)] == [1]
    clock.now += 4.9
    assert [r.index for r in replicas.order(None)] == [1]
    clock.now += 0.2
    assert replicas.order(None)[0].index == 0  # its probe comes first
    release = asyncio.Event()

    async def probe(replica: Any, deadline: float | None) -> None:
        assert replica.index == 0
        assert breakers["m.upstream[0]"].allow()  # as the client does: now half-open
        await release.wait()

    probing = asyncio.create_task(replicas.run(None, probe))
    await wait_until(lambda: replicas.outstanding() == [1, 0], what="the probe in flight")
    assert [r.index for r in replicas.order(None)] == [1]  # nobody else is sent there meanwhile
    release.set()
    await probing


async def test_the_sticky_map_is_bounded_and_forgets_the_oldest() -> None:
    targets = replica_targets("m", ["http://a/v1", "http://b/v1"], fast_policy("model"))
    replicas = Replicas(targets, lambda name: None, deadline=10, sticky_max=3)

    async def work(replica: Any, deadline: float | None) -> int:
        assert deadline is not None and 0 < deadline <= 10
        return int(replica.index)

    for key in ("a", "b", "c"):
        await replicas.run(key, work)
    await replicas.run("a", work)  # "a" used again: "b" is now the oldest
    await replicas.run("d", work)
    assert [replicas.home(k) is not None for k in "abcd"] == [True, False, True, True]
