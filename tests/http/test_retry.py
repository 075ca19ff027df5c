"""The retry policy, driven against real servers on 127.0.0.1.

Each test scripts what the server answers, calls it through ``HttpClient`` with tiny backoff,
and checks both sides: what the caller got (type, attempts, body) and how many requests the
server actually saw.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from rollgym.config import RetryPolicy, ServerConfig, parse_config
from rollgym.errors import (
    ConfigError,
    ConnectError,
    ConnectionLost,
    DeadlineExceeded,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
)
from rollgym.http import HttpClient, Target
from tests.support.scripted import RawScript, Reply, Script, serve_raw, serve_script
from tests.support.stack import fast_policy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(20)


def target(url: str, policy: RetryPolicy, name: str = "env") -> Target:
    return Target.single(name, url, policy)


def always(reply: Reply | int) -> Any:
    return lambda n: reply


def retry_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "rollgym.http" and r.levelno == logging.DEBUG and "retrying in" in r.message
    ]


async def test_two_503s_then_200_succeeds_in_exactly_three_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    script = Script(gen=[503, 503, 200])
    async with serve_script(script) as url, HttpClient() as client:
        # Not idempotent: 503 says the request was not processed, so it is retried anyway.
        result = await client.call(target(url, fast_policy(max_attempts=3)), "/gen", {"q": 1})
        stats = client.stats()["env"]
    assert result["ok"] is True
    assert result["hit"] == 3
    assert script.hits["/gen"] == 3
    assert (stats.calls, stats.attempts, stats.retries, stats.failures) == (1, 3, 2, 0)
    logs = retry_logs(caplog)
    assert len(logs) == 2, logs
    assert "attempt 1/3 failed" in logs[0] and "503" in logs[0]
    assert "attempt 2/3 failed" in logs[1]


async def test_always_500_on_idempotent_endpoint_uses_every_attempt_and_keeps_the_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    body = b'{"detail": "NaN in logprobs at position 17"}'
    script = Script(gen=always(Reply(500, body)))
    policy = fast_policy(max_attempts=4, idempotent=True)
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.call(target(url, policy, "vllm"), "/gen", {})
    err = info.value
    assert script.hits["/gen"] == 4
    assert err.attempts == 4
    assert err.status == 500
    assert err.body is not None and "NaN in logprobs at position 17" in err.body
    assert "NaN in logprobs" in err.message  # FastAPI-style ``detail`` is lifted into the message
    assert (err.server, err.endpoint, err.method) == ("vllm", "/gen", "POST")
    assert err.retryable is True
    assert pickle.loads(pickle.dumps(err)) == err
    assert len(retry_logs(caplog)) == 3
    assert any("giving up after 4 attempt(s)" in r.getMessage() for r in caplog.records)


async def test_500_on_non_idempotent_endpoint_fails_after_one_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    script = Script(tool=always(500))
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.call(target(url, fast_policy(max_attempts=4)), "/tool", {})
    assert script.hits["/tool"] == 1
    assert info.value.attempts == 1
    assert info.value.status == 500
    assert info.value.retryable is False
    assert retry_logs(caplog) == []
    assert any("giving up after 1 attempt(s)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_4xx_fails_after_one_attempt_without_sleeping(status: int) -> None:
    script = Script(x=always(status))
    # Idempotent, generous attempts, a backoff that would show, and 408/429 allowed: still the
    # other 4xx are never retried.
    policy = fast_policy(
        max_attempts=5,
        idempotent=True,
        backoff_initial=1.0,
        backoff_max=1.0,
        retry_4xx=[408, 429],
    )
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.call(target(url, policy), "/x", {})
    # One attempt: the client sleeps only before a retry (no wall-clock bound, which a busy
    # machine could break).
    assert script.hits["/x"] == 1
    assert info.value.status == status
    assert info.value.attempts == 1
    assert info.value.retryable is False


async def test_429_with_retry_after_waits_then_succeeds() -> None:
    script = Script(gen=[Reply(429, headers={"Retry-After": "1"}), 200])
    policy = fast_policy(max_attempts=3, retry_4xx=[429])
    async with serve_script(script) as url, HttpClient() as client:
        t0 = time.monotonic()
        result = await client.call(target(url, policy), "/gen", {})
        elapsed = time.monotonic() - t0
    assert result["hit"] == 2
    assert script.hits["/gen"] == 2
    assert elapsed >= 1.0  # waited for Retry-After (only a lower bound: load only adds)


async def test_429_with_retry_after_beyond_the_cap_fails_at_once() -> None:
    script = Script(gen=always(Reply(429, headers={"Retry-After": "100"})))
    policy = fast_policy(max_attempts=3, retry_4xx=[429], retry_after_cap=30)
    async with serve_script(script) as url, HttpClient() as client:
        # Far less than the 100 s it was told to wait, however busy the machine.
        async with asyncio.timeout(15):
            with pytest.raises(HTTPStatusError) as info:
                await client.call(target(url, policy), "/gen", {})
    assert info.value.status == 429
    assert info.value.attempts == 1
    assert script.hits["/gen"] == 1


async def test_429_is_not_retried_unless_the_policy_lists_it() -> None:
    script = Script(gen=always(Reply(429, headers={"Retry-After": "0"})))
    policy = fast_policy(max_attempts=3, idempotent=True)
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.call(target(url, policy), "/gen", {})
    assert info.value.status == 429
    assert info.value.attempts == 1
    assert script.hits["/gen"] == 1


async def test_connection_refused_is_retried_up_to_max_attempts(
    caplog: pytest.LogCaptureFixture, dead_url: Callable[[], str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    url = dead_url()
    async with HttpClient() as client:
        with pytest.raises(ConnectError) as info:
            # Not idempotent: nothing was sent, so a refused connection is always safe to retry.
            await client.call(target(url, fast_policy(max_attempts=4)), "/gen", {})
        stats = client.stats()["env"]
    err = info.value
    assert err.attempts == 4
    assert stats.attempts == 4
    assert err.retryable is True
    assert err.server == "env" and err.endpoint == "/gen"
    assert "cannot connect" in err.message
    assert len(retry_logs(caplog)) == 3
    assert pickle.loads(pickle.dumps(err)) == err


@pytest.mark.parametrize("action", ["close", "reset"])
async def test_connection_lost_after_sending_is_replayed_on_idempotent_endpoint(
    action: str,
) -> None:
    raw = RawScript([action, action, 200])
    async with serve_raw(raw) as url, HttpClient() as client:
        policy = fast_policy(max_attempts=3, idempotent=True)
        result = await client.call(target(url, policy), "/verify", {"x": 1})
    assert result == {"ok": True, "hit": 3}
    assert raw.hits == 3


@pytest.mark.parametrize("action", ["close", "reset"])
async def test_connection_lost_after_sending_is_not_replayed_on_non_idempotent_endpoint(
    action: str,
) -> None:
    raw = RawScript([action], default=200)
    async with serve_raw(raw) as url, HttpClient() as client:
        with pytest.raises(ConnectionLost) as info:
            await client.call(target(url, fast_policy(max_attempts=3)), "/tool", {"x": 1})
    assert raw.hits == 1
    assert info.value.attempts == 1
    assert info.value.retryable is False
    assert pickle.loads(pickle.dumps(info.value)) == info.value


async def test_connection_lost_every_time_fails_after_max_attempts() -> None:
    raw = RawScript([], default="reset")
    async with serve_raw(raw) as url, HttpClient() as client:
        with pytest.raises(ConnectionLost) as info:
            policy = fast_policy(max_attempts=3, idempotent=True)
            await client.call(target(url, policy), "/verify", {})
    assert raw.hits == 3
    assert info.value.attempts == 3


async def test_slow_answer_is_a_read_timeout_per_attempt() -> None:
    script = Script(gen=always(Reply(200, delay=5.0)))
    policy = fast_policy(max_attempts=3, attempt_timeout=0.2)
    async with serve_script(script) as url, HttpClient() as client:
        t0 = time.monotonic()
        with pytest.raises(ReadTimeout) as info:
            await client.call(target(url, policy), "/gen", {})
        elapsed = time.monotonic() - t0
    assert info.value.attempts == 1  # not idempotent: the request may have been processed
    assert script.hits["/gen"] == 1
    assert elapsed >= 0.2  # its attempt timeout; a ReadTimeout, so not the 5 s answer


async def test_slow_answer_on_idempotent_endpoint_times_out_every_attempt() -> None:
    script = Script(gen=always(Reply(200, delay=5.0)))
    policy = fast_policy(max_attempts=2, attempt_timeout=0.2, idempotent=True)
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(ReadTimeout) as info:
            await client.call(target(url, policy), "/gen", {})
    assert info.value.attempts == 2
    assert script.hits["/gen"] == 2


@pytest.mark.parametrize("where", ["call", "policy"])
async def test_total_deadline_shorter_than_the_attempts_is_deadline_exceeded(where: str) -> None:
    script = Script(gen=always(Reply(200, delay=5.0)))
    extra = {"deadline": 0.5} if where == "policy" else {}
    policy = fast_policy(max_attempts=5, attempt_timeout=0.3, idempotent=True, **extra)
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(DeadlineExceeded) as info:
            await client.call(
                target(url, policy), "/gen", {}, deadline=0.5 if where == "call" else None
            )
    # Two attempts of 0.3 s in a 0.5 s deadline, not the five the policy allows.
    assert info.value.attempts == 2
    assert script.hits["/gen"] == 2
    assert isinstance(info.value.origin, ReadTimeout)


async def test_retry_after_beyond_the_deadline_fails_at_once_as_deadline_exceeded() -> None:
    # Retry-After under its cap (30 s) but past the deadline: the call fails at once, long
    # before the deadline (a bound wide enough for a busy machine).
    script = Script(gen=always(Reply(503, b"busy", headers={"Retry-After": "25"})))
    policy = fast_policy(max_attempts=3, deadline=20.0)
    async with serve_script(script) as url, HttpClient() as client:
        async with asyncio.timeout(10):
            with pytest.raises(DeadlineExceeded) as info:
                await client.call(target(url, policy), "/gen", {})
    assert script.hits["/gen"] == 1
    assert isinstance(info.value.origin, HTTPStatusError)
    assert info.value.origin.status == 503 and info.value.origin.body == "busy"


async def test_endpoint_override_is_honoured() -> None:
    script = Script(verify=always(500), tool=always(500), score=always(500))
    policy = fast_policy(
        max_attempts=3,
        idempotent=False,
        endpoints={
            "/verify": {"idempotent": True},
            "/score": {"idempotent": True, "max_attempts": 5},
        },
    )
    async with serve_script(script) as url, HttpClient() as client:
        errors = {}
        for endpoint in ("/verify", "/tool", "/score"):
            with pytest.raises(HTTPStatusError) as info:
                await client.call(target(url, policy), endpoint, {})
            errors[endpoint] = info.value
    assert dict(script.hits) == {"/verify": 3, "/tool": 1, "/score": 5}
    assert {k: e.attempts for k, e in errors.items()} == {"/verify": 3, "/tool": 1, "/score": 5}


async def test_resources_server_defaults_replay_verify_but_not_tools() -> None:
    # The policy a resources server gets from its kind: /verify is replay-safe, tools are not.
    retry = ServerConfig.model_validate(
        {
            "kind": "resources",
            "impl": "x",
            "retry": {**fast_policy().model_dump(), "max_attempts": 3},
        }
    ).retry
    script = Script(verify=always(500), lookup=always(500))
    async with serve_script(script) as url, HttpClient() as client:
        for endpoint in ("/verify", "/lookup"):
            with pytest.raises(HTTPStatusError):
                await client.call(target(url, retry), endpoint, {})
    assert dict(script.hits) == {"/verify": 3, "/lookup": 1}


def test_max_attempts_above_ten_is_rejected_by_config_validation() -> None:
    assert RetryPolicy(max_attempts=10).max_attempts == 10
    with pytest.raises(ValidationError, match="max_attempts"):
        RetryPolicy(max_attempts=11)
    with pytest.raises(ValidationError, match="max_attempts"):
        RetryPolicy.model_validate({"endpoints": {"/verify": {"max_attempts": 11}}})
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "servers": {
                    "m": {"kind": "model", "impl": "scripted", "retry": {"max_attempts": 50}}
                }
            },
            "run.yaml",
        )
    assert "run.yaml" in info.value.message
    assert "servers.m.retry.max_attempts" in info.value.message


async def test_cancelling_during_backoff_makes_no_further_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rollgym.http")
    # Retry-After puts a floor of 2 s under the (jittered) backoff, so the task is surely asleep.
    script = Script(gen=always(Reply(503, headers={"Retry-After": "2"})))
    policy = fast_policy(max_attempts=5, backoff_initial=2.0, backoff_max=2.0)
    async with serve_script(script) as url, HttpClient() as client:
        task = asyncio.create_task(client.call(target(url, policy), "/gen", {}))
        await wait_until(lambda: retry_logs(caplog))
        assert script.hits["/gen"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        stats = client.stats()["env"]
    assert script.hits["/gen"] == 1
    assert stats.attempts == 1


async def test_malformed_json_in_a_200_answer_is_a_protocol_error() -> None:
    script = Script(gen=always(Reply(200, b'{"output": [unterminated')))
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(ProtocolError) as info:
            await client.call(target(url, fast_policy(max_attempts=3)), "/gen", {})
    err = info.value
    assert err.attempts == 1
    assert script.hits["/gen"] == 1
    assert err.status == 200
    assert err.body == '{"output": [unterminated'
    assert "not valid JSON" in err.message
    assert pickle.loads(pickle.dumps(err)) == err


async def test_malformed_json_on_idempotent_endpoint_is_retried() -> None:
    script = Script(gen=[Reply(200, b"<html>oops</html>"), 200])
    async with serve_script(script) as url, HttpClient() as client:
        result = await client.call(
            target(url, fast_policy(max_attempts=3, idempotent=True)), "/gen", {}
        )
    assert result["hit"] == 2
    assert script.hits["/gen"] == 2
