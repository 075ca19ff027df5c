"""The policy gate of rollgym's model servers, served for real on 127.0.0.1: versions and
replicas on every call, pause (hold, abort and re-issue), resume, a pause never resumed, the
staleness refusal, and hostile bodies and headers. Clients: the OpenAI SDK and aiohttp."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from rollgym.models.scripted import ScriptedModel
from rollgym.server.policy import MAX_PAUSE_S
from rollgym.testing import serve_server
from rollgym.wire import (
    ABORTED_VERSIONS,
    HEADER_OLDEST_VERSION,
    HEADER_ROLLOUT,
    PAUSE_ENDPOINT,
    POLICY_ENDPOINT,
    POLICY_VERSION,
    REPLICA,
    RESUME_ENDPOINT,
    UPSTREAM_KEY,
)
from tests.support.waiting import wait_until

from .held_model import TIMEOUT, HeldModel, get, post

pytestmark = pytest.mark.timeout(60)

SAY = {"input": "hello", "metadata": {"rollgym_script": [{"say": "hi there"}]}}


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def entry(response: Any) -> dict[str, Any]:
    """The ``rollgym_upstream`` entry of one call's answer (an SDK object or JSON)."""
    data = response if isinstance(response, dict) else response.model_dump()
    found = data[UPSTREAM_KEY]
    assert isinstance(found, dict)
    return found


async def test_every_call_records_its_version_and_replica_and_resume_moves_the_version() -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        client = sdk(url)
        first = await client.responses.create(model="m", **SAY)  # type: ignore[call-overload]
        assert entry(first)[POLICY_VERSION] == 0 and entry(first)[REPLICA] == 0
        assert ABORTED_VERSIONS not in entry(first)
        assert first.output_text == "hi there"

        status, state = await post(session, url + RESUME_ENDPOINT, {"version": 3})
        assert status == 200, state
        assert state == {"version": 3, "paused": False, "max_staleness": None, "released": 0}
        assert await get(session, url + POLICY_ENDPOINT) == {
            "version": 3, "paused": False, "max_staleness": None, "in_flight": 0, "held": 0,
        }  # fmt: skip
        second = await client.responses.create(model="m", **SAY)  # type: ignore[call-overload]
        assert entry(second)[POLICY_VERSION] == 3
        # Chat completions are model calls too: stamped at the completion's top level.
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        extra = chat.model_extra or {}
        assert (extra[POLICY_VERSION], extra[REPLICA]) == (3, 0)
        # A streamed Responses call carries the same entry on its completed response.
        async with client.responses.stream(model="m", **SAY) as stream:  # type: ignore[arg-type]
            done = await stream.get_final_response()
        assert entry(done)[POLICY_VERSION] == 3


async def test_a_pause_holds_new_calls_and_the_resume_releases_them_under_the_new_version() -> None:
    async with (
        serve_server(HeldModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        assert isinstance(model, HeldModel)
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 60})
        assert status == 200, paused
        assert paused == {"version": 0, "paused": True, "aborted": 0, "held": 0, "in_flight": 0}
        calls = [
            asyncio.create_task(
                post(session, url + "/v1/responses", SAY, {HEADER_ROLLOUT: f"r{i}"})
            )
            for i in range(3)
        ]
        await wait_until(lambda: model.policy.held == 3, what="three held calls")
        assert model.starts == []  # held before any work began
        state = await get(session, url + POLICY_ENDPOINT)
        assert (state["paused"], state["held"], state["in_flight"]) == (True, 3, 0)
        status, resumed = await post(session, url + RESUME_ENDPOINT, {"version": 2})
        assert status == 200 and resumed["released"] == 3 and resumed["paused"] is False
        answers = await asyncio.gather(*calls)
    assert [s for s, _ in answers] == [200, 200, 200]
    assert [entry(a)[POLICY_VERSION] for _, a in answers] == [2, 2, 2]
    assert all(ABORTED_VERSIONS not in entry(a) for _, a in answers)
    assert model.starts == [2, 2, 2]


async def test_a_pause_with_abort_reissues_the_same_request_and_records_both_versions() -> None:
    async with (
        serve_server(HeldModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        assert isinstance(model, HeldModel)
        model.go.clear()
        client = sdk(url)
        call = asyncio.create_task(
            client.responses.create(  # type: ignore[call-overload]
                model="m", extra_headers={HEADER_ROLLOUT: "7:0"}, **SAY
            )
        )
        await wait_until(lambda: model.starts == [0], what="the call running upstream")
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert status == 200, paused
        # Answered once nothing runs upstream: the aborted call is held, not failed.
        assert paused == {"version": 0, "paused": True, "aborted": 1, "held": 1, "in_flight": 0}
        assert model.cancelled == 1 and not call.done()
        model.go.set()
        status, resumed = await post(session, url + RESUME_ENDPOINT, {"version": 1})
        assert status == 200 and resumed["released"] == 1
        answer = await call
    assert answer.output_text == "hi there"
    assert entry(answer)[POLICY_VERSION] == 1
    assert entry(answer)[ABORTED_VERSIONS] == [0]
    assert model.starts == [0, 1]
    assert model.requests_seen[0] == model.requests_seen[1]  # re-issued from the same request


async def test_a_resume_to_an_older_version_is_a_409_and_changes_nothing() -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, _model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        assert (await post(session, url + RESUME_ENDPOINT, {"version": 5}))[0] == 200
        await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 30})
        status, body = await post(session, url + RESUME_ENDPOINT, {"version": 4})
        assert status == 409, body
        assert body["error"]["type"] == "invalid_request"
        assert "version 4 is below the live policy version 5" in body["error"]["message"]
        state = await get(session, url + POLICY_ENDPOINT)
        assert (state["version"], state["paused"]) == (5, True)  # still paused, still 5
        # The same version again is no rollback: it resumes.
        assert (await post(session, url + RESUME_ENDPOINT, {"version": 5}))[0] == 200


async def test_a_pause_never_resumed_fails_its_held_calls_as_paused_too_long_and_unpauses() -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, _model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        status, _ = await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 0.3})
        assert status == 200
        status, body = await post(session, url + "/v1/responses", SAY)
        assert status == 504, body
        error = body["error"]
        assert (error["type"], error["retryable"], error["server"]) == (
            "paused_too_long", False, "model",
        )  # fmt: skip
        state = await get(session, url + POLICY_ENDPOINT)
        assert (state["paused"], state["held"]) == (False, 0)  # it unpaused itself
        status, body = await post(session, url + "/v1/responses", SAY)
        assert status == 200 and entry(body)[POLICY_VERSION] == 0


async def test_a_pause_while_paused_extends_its_deadline() -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 0.2})
        status, again = await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 60})
        assert status == 200 and again["paused"] is True
        call = asyncio.create_task(post(session, url + "/v1/responses", SAY))
        await wait_until(lambda: model.policy.held == 1, what="a held call")
        await asyncio.sleep(0.4)  # past the first deadline: the second one holds
        assert not call.done() and model.policy.paused
        await post(session, url + RESUME_ENDPOINT, {"version": 1})
        status, body = await call
    assert status == 200 and entry(body)[POLICY_VERSION] == 1


async def test_a_stale_rollouts_next_call_is_refused_with_stale_rollout() -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        status, resumed = await post(
            session, url + RESUME_ENDPOINT, {"version": 5, "max_staleness": 1}
        )
        assert status == 200 and resumed["max_staleness"] == 1
        client = sdk(url)
        with pytest.raises(openai.ConflictError) as caught:
            await client.responses.create(  # type: ignore[call-overload]
                model="m", extra_headers={HEADER_OLDEST_VERSION: "3"}, **SAY
            )
        error = caught.value.body
        assert isinstance(error, dict)
        assert (error["type"], error["status"], error["retryable"]) == ("stale_rollout", 409, False)
        assert "max_staleness 1" in error["message"]
        # One version behind is within the bound; the first call of a rollout sends no header.
        ok = await client.responses.create(  # type: ignore[call-overload]
            model="m", extra_headers={HEADER_OLDEST_VERSION: "4"}, **SAY
        )
        assert entry(ok)[POLICY_VERSION] == 5
        # max_staleness left out keeps the bound; null lifts it.
        await post(session, url + RESUME_ENDPOINT, {"version": 6})
        assert (await get(session, url + POLICY_ENDPOINT))["max_staleness"] == 1
        await post(session, url + RESUME_ENDPOINT, {"version": 6, "max_staleness": None})
        status, body = await post(session, url + "/v1/responses", SAY, {HEADER_OLDEST_VERSION: "0"})
        assert status == 200, body


async def test_an_aborted_call_stale_at_its_reissue_is_refused_not_run_again() -> None:
    async with (
        serve_server(HeldModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        assert isinstance(model, HeldModel)
        await post(session, url + RESUME_ENDPOINT, {"version": 0, "max_staleness": 1})
        model.go.clear()
        call = asyncio.create_task(
            post(session, url + "/v1/responses", SAY, {HEADER_OLDEST_VERSION: "0"})
        )
        await wait_until(lambda: model.starts == [0], what="the call running upstream")
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert (status, paused["aborted"], paused["held"]) == (200, 1, 1)
        model.go.set()
        await post(session, url + RESUME_ENDPOINT, {"version": 2})
        status, body = await call
    assert status == 409, body
    assert body["error"]["type"] == "stale_rollout"
    assert model.starts == [0]  # refused before it ran again


async def test_many_calls_held_and_aborted_are_each_answered_exactly_once() -> None:
    in_flight, new = 100, 100
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        serve_server(HeldModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT, connector=connector) as session,
    ):
        assert isinstance(model, HeldModel)
        model.go.clear()

        def call(i: int) -> asyncio.Task[tuple[int, Any]]:
            body = {"input": f"call {i}", "metadata": {"rollgym_script": [{"say": f"answer {i}"}]}}
            return asyncio.create_task(
                post(session, url + "/v1/responses", body, {HEADER_ROLLOUT: f"{i}:0"})
            )

        running = [call(i) for i in range(in_flight)]
        await wait_until(lambda: len(model.starts) == in_flight, what="calls running upstream")
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert (status, paused["aborted"], paused["held"], paused["in_flight"]) == (
            200, in_flight, in_flight, 0,
        )  # fmt: skip
        held = [call(in_flight + i) for i in range(new)]
        await wait_until(lambda: model.policy.held == in_flight + new, what="all calls held")
        model.go.set()
        status, resumed = await post(session, url + RESUME_ENDPOINT, {"version": 1})
        assert resumed["released"] == in_flight + new
        answers = await asyncio.gather(*running, *held)
    assert all(status == 200 for status, _ in answers)
    said = [body["output"][0]["content"][0]["text"] for _, body in answers]
    assert said == [f"answer {i}" for i in range(in_flight + new)]  # none lost, none mixed up
    assert [entry(b).get(ABORTED_VERSIONS) for _, b in answers] == [[0]] * in_flight + [None] * new
    assert all(entry(b)[POLICY_VERSION] == 1 for _, b in answers)
    # Each call ran once under version 0 (then aborted) or not at all, and once under 1.
    assert sorted(model.starts) == [0] * in_flight + [1] * (in_flight + new)
    assert model.policy.in_flight == 0 and model.policy.held == 0


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        (PAUSE_ENDPOINT, {"abort": "yes"}, "abort"),
        (PAUSE_ENDPOINT, {"abort": 1}, "abort"),
        (PAUSE_ENDPOINT, {"timeout_s": -1}, "timeout_s"),
        (PAUSE_ENDPOINT, {"timeout_s": 0}, "timeout_s"),
        (PAUSE_ENDPOINT, {"timeout_s": MAX_PAUSE_S * 1000}, "timeout_s"),
        (PAUSE_ENDPOINT, {"timeout_s": True}, "timeout_s"),
        (PAUSE_ENDPOINT, {"timeout_s": "10"}, "timeout_s"),
        (PAUSE_ENDPOINT, {"abrot": True}, "abrot"),
        (PAUSE_ENDPOINT, [1], "JSON object"),
        (RESUME_ENDPOINT, {"version": -1}, "version"),
        (RESUME_ENDPOINT, {"version": 1.5}, "version"),
        (RESUME_ENDPOINT, {"version": True}, "version"),
        (RESUME_ENDPOINT, {"version": "3"}, "version"),
        (RESUME_ENDPOINT, {"version": 2**63}, "version"),
        (RESUME_ENDPOINT, b'{"version": 1180591620717411303424}', "version"),
        (RESUME_ENDPOINT, {}, "version"),
        (RESUME_ENDPOINT, None, "version"),
        (RESUME_ENDPOINT, {"version": 1, "max_staleness": -2}, "max_staleness"),
        (RESUME_ENDPOINT, {"version": 1, "max_staleness": False}, "max_staleness"),
    ],
)
async def test_a_malformed_pause_or_resume_body_is_a_4xx_naming_the_field(
    endpoint: str, body: Any, field: str
) -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        raw = b"" if body is None else None
        status, answer = await post(session, url + endpoint, raw if raw is not None else body)
        assert 400 <= status < 500, answer
        assert field in answer["error"]["message"], answer
        assert (model.policy.version, model.policy.paused) == (0, False)  # nothing changed


@pytest.mark.parametrize("forged", ["abc", "-1", "1e3", "", " ", "٣", "9" * 5000, "0x10"])
async def test_a_forged_oldest_version_header_is_a_400_not_a_500(forged: str) -> None:
    async with (
        serve_server(ScriptedModel, name="model") as (url, _model),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        await post(session, url + RESUME_ENDPOINT, {"version": 1, "max_staleness": 0})
        status, answer = await post(
            session, url + "/v1/responses", SAY, {HEADER_OLDEST_VERSION: forged}
        )
        assert status == 400, answer
        assert HEADER_OLDEST_VERSION in answer["error"]["message"]
        # On chat completions too.
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        status, answer = await post(
            session, url + "/v1/chat/completions", chat, {HEADER_OLDEST_VERSION: forged}
        )
        assert status == 400, answer
