"""The client's send path driven through a scripted transport: retries, breaker, budget and
pinning with no sockets at all (the real-socket versions live in test_retry.py)."""

from __future__ import annotations

import asyncio
import logging
import pickle
from typing import Any

import orjson
import pytest

from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    ConnectionLost,
    DeadlineExceeded,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
    SessionLost,
)
from rollgym.http import HttpClient, RawAnswer, Target
from rollgym.http.breaker import CLOSED, OPEN
from tests.http.fake_transport import Fail, FakeTransport
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(10)

URL = "http://env.invalid"
NO_WAIT = {"backoff_initial": 0.0, "backoff_max": 0.0}


def target(name: str = "env", urls: tuple[str, ...] = (URL,), **policy: Any) -> Target:
    return Target(name, urls, fast_policy(**{**NO_WAIT, **policy}))


def client_with(*script: Any, default: Any = 200) -> tuple[HttpClient, FakeTransport]:
    fake = FakeTransport(list(script), default)
    return HttpClient(transport=fake), fake


async def test_two_503s_then_200_is_three_attempts() -> None:
    client, fake = client_with(503, 503, 200)
    result = await client.call(target(max_attempts=3), "/gen", {"q": 1})
    assert result == {"ok": True, "hit": 3}
    assert fake.urls() == [URL + "/gen"] * 3
    assert all(orjson.loads(s.body) == {"q": 1} for s in fake.sent)
    stats = client.stats()["env"]
    assert (stats.calls, stats.attempts, stats.retries, stats.failures) == (1, 3, 2, 0)


async def test_500_is_tried_once_unless_idempotent() -> None:
    client, fake = client_with(default=500)
    with pytest.raises(HTTPStatusError) as info:
        await client.call(target(max_attempts=4), "/tool", {})
    assert len(fake.sent) == 1
    assert (info.value.attempts, info.value.retryable, info.value.status) == (1, False, 500)

    with pytest.raises(HTTPStatusError) as info:
        await client.call(target(max_attempts=4, idempotent=True), "/tool", {})
    assert len(fake.sent) == 1 + 4
    assert (info.value.attempts, info.value.retryable) == (4, True)


async def test_refused_connection_is_retried_even_when_not_idempotent() -> None:
    client, fake = client_with(Fail(ConnectError), Fail(ConnectError), 200)
    assert (await client.call(target(max_attempts=3), "/tool", {}))["hit"] == 3
    assert len(fake.sent) == 3


async def test_reset_after_sending_is_final_unless_idempotent() -> None:
    client, fake = client_with(Fail(ConnectionLost), default=200)
    with pytest.raises(ConnectionLost) as info:
        await client.call(target(max_attempts=3), "/tool", {})
    assert len(fake.sent) == 1 and info.value.retryable is False


async def test_429_with_retry_after_past_the_cap_fails_at_once() -> None:
    answer = RawAnswer(429, b"{}", retry_after="100")
    client, fake = client_with(default=answer)
    with pytest.raises(HTTPStatusError) as info:
        await client.call(target(max_attempts=3, retry_4xx=[429], retry_after_cap=30), "/g", {})
    assert len(fake.sent) == 1
    assert info.value.status == 429 and info.value.attempts == 1


async def test_429_within_the_cap_is_retried_only_when_listed() -> None:
    answer = RawAnswer(429, b"{}", retry_after="0")
    client, fake = client_with(answer, 200)
    assert (await client.call(target(retry_4xx=[429]), "/g", {}))["hit"] == 2
    client, fake = client_with(answer, 200)
    with pytest.raises(HTTPStatusError):
        await client.call(target(idempotent=True), "/g", {})
    assert len(fake.sent) == 1


async def test_a_body_that_declares_itself_final_is_not_retried() -> None:
    body = b'{"error": {"type": "http_status", "message": "done", "retryable": false}}'
    client, fake = client_with(default=RawAnswer(503, body))
    with pytest.raises(HTTPStatusError) as info:
        await client.call(target(max_attempts=3), "/run", {})
    assert len(fake.sent) == 1
    assert info.value.retryable is False and "done" in info.value.message


async def test_retry_after_past_the_deadline_is_deadline_exceeded_at_once() -> None:
    client, fake = client_with(default=RawAnswer(503, b"busy", retry_after="5"))
    with pytest.raises(DeadlineExceeded) as info:
        await client.call(target(max_attempts=3, deadline=1.0), "/gen", {})
    assert len(fake.sent) == 1
    err = info.value
    assert isinstance(err.origin, HTTPStatusError) and err.origin.body == "busy"
    assert err.attempts == 1 and err.retryable is False


async def test_a_read_timeout_cut_by_the_deadline_is_deadline_exceeded() -> None:
    client, fake = client_with(default=Fail(ReadTimeout))
    policy = {"max_attempts": 3, "idempotent": True, "attempt_timeout": 60.0}
    with pytest.raises(DeadlineExceeded) as info:
        await client.call(target(**policy), "/gen", {}, deadline=0.5)
    # The attempt got what was left of the call's deadline, not its own 60 s.
    assert len(fake.sent) == 1 and fake.sent[0].timeout <= 0.5
    assert isinstance(info.value.origin, ReadTimeout)
    # With its own timeout, the same failure is just a read timeout, retried.
    client, fake = client_with(Fail(ReadTimeout), 200)
    assert (await client.call(target(**policy), "/gen", {}))["hit"] == 2


async def test_breaker_opens_after_n_failed_calls_and_counts_calls_not_attempts() -> None:
    client, fake = client_with(default=503)
    tgt = target(max_attempts=3, breaker={"consecutive_failures": 2, "cooldown": 60})
    for _ in range(2):
        with pytest.raises(HTTPStatusError):
            await client.call(tgt, "/gen", {})
    assert len(fake.sent) == 6
    breaker = client.breaker("env")
    assert breaker is not None and breaker.state == OPEN
    with pytest.raises(CircuitOpen) as info:
        await client.call(tgt, "/gen", {})
    assert len(fake.sent) == 6  # not sent
    assert info.value.attempts >= 1 and info.value.retryable is False
    assert client.stats()["env"].circuit_rejected == 1


async def test_a_gateway_reporting_another_servers_failure_is_not_blamed() -> None:
    body = orjson.dumps(
        {
            "error": {
                "type": "upstream_error",
                "message": "model failed",
                "server": "agent",
                "origin": {"type": "http_status", "message": "boom", "status": 500, "server": "m"},
            }
        }
    )
    client, fake = client_with(default=RawAnswer(502, body))
    tgt = target("agent", max_attempts=1, breaker={"consecutive_failures": 1, "cooldown": 60})
    for _ in range(3):
        with pytest.raises(HTTPStatusError) as info:
            await client.call(tgt, "/run", {})
        assert info.value.root().server == "m"
    assert len(fake.sent) == 3  # never refused by an open circuit
    breaker = client.breaker("agent")
    assert breaker is not None and breaker.state == CLOSED


async def test_spent_budget_is_budget_exhausted_and_counts_against_the_server() -> None:
    client, fake = client_with(default=503)
    tgt = target(
        max_attempts=3,
        budget={"ratio": 0, "min_retries_per_window": 0},
        breaker={"consecutive_failures": 1, "cooldown": 60},
    )
    with pytest.raises(BudgetExhausted) as info:
        await client.call(tgt, "/gen", {})
    assert len(fake.sent) == 1
    err = info.value
    assert err.status == 503 and err.attempts == 1 and err.server == "env"
    assert isinstance(err.origin, HTTPStatusError)
    assert pickle.loads(pickle.dumps(err)) == err
    assert client.stats()["env"].budget_refused == 1
    # The call failed because the server did: it is one failed call for the breaker.
    breaker = client.breaker("env")
    assert breaker is not None and breaker.state == OPEN


async def test_pinned_call_to_a_replica_marked_down_fails_at_once_unsent() -> None:
    a, b = "http://a.invalid", "http://b.invalid"
    client, fake = client_with(default=200)
    tgt = target(urls=(a, b), max_attempts=3, idempotent=True)
    await client.call(tgt, "/seed_session", {}, sticky="r1")
    home = fake.sent[0].url.removesuffix("/seed_session")
    client.mark_down(tgt, home)
    assert client.live_urls(tgt) == [u for u in (a, b) if u != home]
    with pytest.raises(SessionLost) as info:
        await client.call(tgt, "/verify", {}, sticky="r1", pin=True)
    assert len(fake.sent) == 1
    assert info.value.retryable is False and info.value.url == home
    assert info.value.type == "session_lost" and "session lived there" in info.value.message
    # Unpinned, the same sticky key fails over to the live replica.
    await client.call(tgt, "/verify", {}, sticky="r1")
    assert fake.sent[-1].url.startswith(b if home == a else a)


async def test_pinned_call_whose_replica_refuses_fails_after_one_attempt() -> None:
    a, b = "http://a.invalid", "http://b.invalid"
    client, fake = client_with(200, Fail(ConnectError, "cannot connect"), default=200)
    tgt = target(urls=(a, b), max_attempts=3, idempotent=True)
    await client.call(tgt, "/seed_session", {}, sticky="r1")
    with pytest.raises(ConnectError) as info:
        await client.call(tgt, "/verify", {}, sticky="r1", pin=True)
    assert len(fake.sent) == 2  # the refused attempt marked the replica down; no failover
    err = info.value
    assert err.retryable is False and err.attempts == 2
    assert isinstance(err.origin, ConnectError) and "cannot connect" in err.origin.message


async def test_a_pinned_call_refused_unsent_frees_the_half_open_probe() -> None:
    a, b = "http://a.invalid", "http://b.invalid"
    client, fake = client_with(200, 503, default=200)
    tgt = target(urls=(a, b), max_attempts=1, breaker={"consecutive_failures": 1, "cooldown": 0.05})
    await client.call(tgt, "/seed_session", {}, sticky="r1")
    home = fake.sent[0].url.removesuffix("/seed_session")
    with pytest.raises(HTTPStatusError):
        await client.call(tgt, "/gen", {}, sticky="r1")  # the home replica's circuit opens
    await asyncio.sleep(0.06)  # past the cool-down: the next call there is its probe
    client.mark_down(tgt, home)
    with pytest.raises(ConnectError):
        await client.call(tgt, "/verify", {}, sticky="r1", pin=True)
    # That call was never sent, so it must not hold the probe slot: this one is the probe.
    client._state(tgt).replicas.mark_up((a, b).index(home))
    assert (await client.call(tgt, "/gen", {}, sticky="r1"))["ok"] is True
    assert fake.sent[-1].url == home + "/gen"
    assert [br.state for br in client.breakers("env")] == [CLOSED, CLOSED]


async def test_errors_are_new_objects_and_the_transports_are_left_alone() -> None:
    client, fake = client_with(default=Fail(ConnectError))
    with pytest.raises(ConnectError) as info:
        await client.call(target(max_attempts=3), "/gen", {})
    assert len(fake.raised) == 3
    assert all(info.value is not raised for raised in fake.raised)
    assert info.value.attempts == 3
    assert [r.attempts for r in fake.raised] == [1, 1, 1]


async def test_credentials_the_request_carried_are_scrubbed_from_the_final_error() -> None:
    key = "abc123XYZ-not-key-shaped"  # no "sk-" prefix: only the exact value can find it
    echo = f"you sent token={key}; retrying won't help"
    origin = {"type": "http_status", "message": f"bad key {key}", "status": 401, "server": "up"}
    body = orjson.dumps({"error": {"message": echo, "origin": origin}})
    headers = {"Authorization": f"Bearer {key}"}

    refused = Fail(ConnectError, f"refused for {key}", body=echo)
    client, fake = client_with(refused, default=RawAnswer(500, body))
    with pytest.raises(HTTPStatusError) as info:
        await client.call(target(max_attempts=2), "/v1/chat", {}, headers=headers)
    assert fake.sent[0].headers["Authorization"] == f"Bearer {key}"  # sent, of course
    err = info.value
    assert err.status == 500 and err.attempts == 2
    text = orjson.dumps(err.to_dict()).decode() + str(err)
    assert key not in text
    assert "REDACTED" in (err.body or "")
    assert err.origin is not None and "REDACTED" in err.origin.message
    # The transport's own error kept the key (it is not ours to change); ours never has it.
    assert key in fake.raised[0].message


async def test_an_earlier_attempts_error_is_scrubbed_as_the_final_origin() -> None:
    key = "qwerty-123456-secret"
    a, b = "http://a.invalid", "http://b.invalid"
    client, _ = client_with(200, Fail(ConnectError, f"no {key}", body=key), default=200)
    tgt = target(urls=(a, b), max_attempts=3)
    await client.call(tgt, "/seed_session", {}, sticky="r1")
    with pytest.raises(ConnectError) as info:
        await client.call(tgt, "/verify", {}, headers={"x-api-key": key}, sticky="r1", pin=True)
    assert info.value.origin is not None and info.value.origin.body == "REDACTED"
    assert key not in orjson.dumps(info.value.to_dict()).decode()


async def test_call_wants_an_object_and_call_json_takes_any_json() -> None:
    listed = RawAnswer(200, b'[{"name": "lookup"}]')
    client, fake = client_with(default=listed)
    assert await client.call_json(target(), "/tools", {}) == [{"name": "lookup"}]
    with pytest.raises(ProtocolError) as info:
        await client.call(target(max_attempts=3), "/tools", {})
    err = info.value
    assert len(fake.sent) == 2  # not idempotent: a 2xx we cannot use is not replayed
    assert (err.server, err.endpoint, err.status) == ("env", "/tools", 200)
    assert "list" in err.message and "not an object" in err.message
    assert err.body == '[{"name": "lookup"}]'


async def test_a_non_object_answer_is_retried_on_an_idempotent_endpoint() -> None:
    client, fake = client_with(RawAnswer(200, b'"oops"'), 200)
    result = await client.call(target(idempotent=True), "/verify", {})
    assert result["hit"] == 2 and len(fake.sent) == 2


async def test_giving_up_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    client, _ = client_with(default=503)
    with pytest.raises(HTTPStatusError):
        await client.call(target(max_attempts=2), "/gen", {})
    messages = [r.getMessage() for r in caplog.records if r.name == "rollgym.http"]
    assert sum("retrying in" in m for m in messages) == 1
    assert sum("giving up after 2 attempt(s)" in m for m in messages) == 1


async def test_an_injected_transport_is_used_and_left_to_its_owner() -> None:
    closed = []

    class Closing(FakeTransport):
        async def close(self) -> None:
            closed.append(True)

    fake = Closing([], 200)
    async with HttpClient(transport=fake) as client:
        await client.call(target(), "/x", {})
    assert len(fake.sent) == 1 and closed == []


async def test_call_stream_sends_its_idle_timeout_and_retries_a_silent_attempt() -> None:
    events = b'data: {"n": 1}\n\ndata: [DONE]\n\n'
    # The call's deadline (5 s) is below the attempt timeout: a read timeout could be the
    # deadline's, but a shorter idle timeout was in force, so it is retried, not final.
    client, fake = client_with(Fail(ReadTimeout), RawAnswer(200, events))
    answer = await client.call_stream(
        target(idempotent=True, attempt_timeout=60), "/gen", {}, idle_timeout=0.5, deadline=5
    )
    assert answer.events == [{"n": 1}] and answer.whole is None
    assert [s.idle_timeout for s in fake.sent] == [0.5, 0.5]
    await client.call(target(), "/x", {})
    assert fake.sent[-1].idle_timeout is None  # plain calls have none
