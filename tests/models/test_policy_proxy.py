"""The policy gate on ``openai_proxy`` with two upstream replicas, all served for real on
127.0.0.1: which replica answered and which version each call ran under, on the call and on the
rollout's record (multi-turn, through the tool agent and the trainer client), and a pause whose
abort closes the upstream request (as vLLM aborts a request whose client disconnects)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from rollgym.collect.records import ScoredRollout
from rollgym.http import Target
from rollgym.integrations.samples import rollout_samples
from rollgym.models.scripted import ScriptedModel
from rollgym.testing import serve_asgi, serve_server
from rollgym.trainer import RolloutClient
from rollgym.wire import (
    ABORTED_VERSIONS,
    HEADER_ROLLOUT,
    PAUSE_ENDPOINT,
    POLICY_VERSION,
    REPLICA,
    RESUME_ENDPOINT,
    UPSTREAM_KEY,
)
from tests.support.stack import ECHO_TOOL, fast_policy
from tests.support.waiting import wait_until

from .held_model import TIMEOUT, HeldModel, post
from .vllm_double import VllmDouble

pytestmark = pytest.mark.timeout(60)

SAY = {"input": "hello", "metadata": {"rollgym_script": [{"say": "hi there"}]}}
QUICK = {"backoff_initial": 0.01, "backoff_max": 0.02, "budget": {"enabled": False}}


def proxy_options(urls: list[str], **more: Any) -> dict[str, Any]:
    return {"base_url": urls, "idle_timeout": None, "upstream_retry": QUICK, **more}


async def test_each_call_records_the_replica_that_answered_and_the_version_it_reported() -> None:
    async with AsyncExitStack() as stack:
        ups = [await stack.enter_async_context(serve_server(ScriptedModel, name=f"up{i}"))
               for i in range(2)]  # fmt: skip
        # The upstreams report versions of their own (as rollgym's CPU backend does): those win.
        for (_, server), version in zip(ups, (5, 9), strict=True):
            assert isinstance(server, ScriptedModel)
            server.policy.resume(version, None, set_staleness=False)
        options = proxy_options([url + "/v1" for url, _ in ups])
        url, _ = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=TIMEOUT))
        seen: list[tuple[int, int]] = []
        for i in range(6):
            status, body = await post(
                session, url + "/v1/responses", SAY, {HEADER_ROLLOUT: f"{i}:0"}
            )
            assert status == 200, body
            entry = body[UPSTREAM_KEY]
            seen.append((entry[REPLICA], entry[POLICY_VERSION]))
    assert {replica for replica, _ in seen} == {0, 1}  # both replicas answered
    assert all(version == {0: 5, 1: 9}[replica] for replica, version in seen), seen


@asynccontextmanager
async def two_replica_stack(upstreams: list[VllmDouble]) -> AsyncIterator[tuple[str, str]]:
    """Two vLLM-shaped replicas, ``openai_proxy`` with token ids, echo env, tool agent;
    yields (agent URL, proxy URL)."""
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve_asgi(u.app)) for u in upstreams]
        options = proxy_options([u + "/v1" for u in urls], return_token_ids=True, model="toy")
        proxy_url, _ = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        env_url, _ = await stack.enter_async_context(serve_server("echo", name="env"))
        peers = {
            "model": Target.single("model", proxy_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        agent_url, _ = await stack.enter_async_context(
            serve_server("tool_agent", name="agent", options={"model": "model",
                         "resources": "env"}, peers=peers)
        )  # fmt: skip
        yield agent_url, proxy_url


async def test_a_multi_turn_rollouts_record_carries_every_calls_version_and_replica() -> None:
    upstreams = [VllmDouble(), VllmDouble()]
    for u in upstreams:
        u.tool_turns = 2  # two tool calls, then the answer: three model calls per rollout
    async with (
        two_replica_stack(upstreams) as (agent_url, proxy_url),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        # The upstreams (vLLM) say nothing of versions: the proxy's live version is the call's.
        status, _ = await post(session, proxy_url + RESUME_ENDPOINT, {"version": 3})
        assert status == 200
        client = RolloutClient(agent_url)
        row = {
            "responses_create_params": {"input": "please echo v7", "tools": [ECHO_TOOL]},
            "expected_answer": "v7",
        }
        records = [await client.run(row, 0, r, rollout_timeout=30) for r in range(4)]
    replicas_used = set()
    for record in records:
        assert isinstance(record, ScoredRollout), record
        assert record.policy_versions == (3, 3, 3)
        entries = record.response[UPSTREAM_KEY]
        replicas = {e[REPLICA] for e in entries}
        assert len(replicas) == 1  # sticky: a rollout's calls stay on one replica
        replicas_used |= replicas
        # The version is on the token data too: each trainer sample says which policy made it.
        [sample] = rollout_samples(record)
        assert sample.policy_versions == (3, 3, 3)
    assert replicas_used == {0, 1}
    assert sum(len(u.generated) for u in upstreams) == 12


async def test_a_pause_with_abort_closes_the_upstream_request_and_reissues_it() -> None:
    async with AsyncExitStack() as stack:
        up_url, upstream = await stack.enter_async_context(serve_server(HeldModel, name="up"))
        assert isinstance(upstream, HeldModel)
        options = proxy_options([up_url + "/v1"])
        url, proxy = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=TIMEOUT))
        upstream.go.clear()
        call = asyncio.create_task(post(session, url + "/v1/responses", SAY))
        await wait_until(lambda: upstream.starts == [0], what="the upstream generating")
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert (status, paused["aborted"], paused["held"], paused["in_flight"]) == (200, 1, 1, 0)
        # The proxy closed its request: the upstream's work was cancelled, as vLLM aborts it.
        await wait_until(lambda: upstream.cancelled == 1, what="the upstream request aborted")
        assert not call.done()
        # The trainer swaps the weights upstream, then resumes the proxy.
        upstream.policy.resume(1, None, set_staleness=False)
        upstream.go.set()
        status, resumed = await post(session, url + RESUME_ENDPOINT, {"version": 1})
        assert status == 200 and resumed["released"] == 1
        status, body = await call
        assert status == 200, body
        assert proxy.policy.in_flight == 0  # type: ignore[attr-defined]
    entry = body[UPSTREAM_KEY]
    assert (entry[POLICY_VERSION], entry[REPLICA], entry[ABORTED_VERSIONS]) == (1, 0, [0])
    assert upstream.starts == [0, 1]
    assert upstream.requests_seen[0] == upstream.requests_seen[1]


async def test_an_upstream_that_dies_during_a_pause_fails_the_reissued_call_as_its_own_error() -> (
    None
):
    async with AsyncExitStack() as stack:
        upstream_stack = AsyncExitStack()
        up_url, upstream = await upstream_stack.enter_async_context(
            serve_server(HeldModel, name="up")
        )
        assert isinstance(upstream, HeldModel)
        retry = {**QUICK, "max_attempts": 2}
        options = proxy_options([up_url + "/v1"], upstream_retry=retry)
        url, _ = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=TIMEOUT))
        upstream.go.clear()
        call = asyncio.create_task(post(session, url + "/v1/responses", SAY))
        await wait_until(lambda: upstream.starts == [0], what="the upstream generating")
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert (status, paused["aborted"]) == (200, 1)
        await upstream_stack.aclose()  # the upstream dies while the proxy is paused
        await post(session, url + RESUME_ENDPOINT, {"version": 1})
        status, body = await call
    assert status == 502, body
    origin = body["error"]["origin"]
    assert (origin["type"], origin["server"], origin["attempts"]) == (
        "connect_error", "model.upstream", 2,
    )  # fmt: skip
