"""Retry budget and circuit breaker: unit tests on a fake clock, then against real servers."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import random

import pytest

from rollgym.config import BreakerConfig, RetryBudgetConfig
from rollgym.errors import BudgetExhausted, CircuitOpen, HTTPStatusError
from rollgym.http import HttpClient, Target
from rollgym.http.breaker import CLOSED, HALF_OPEN, OPEN, PROBE, READY, SHUT, CircuitBreaker
from rollgym.http.budget import RetryBudget
from tests.support.scripted import Reply, Script, serve_script
from tests.support.stack import fast_policy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(20)


class Clock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def spend(budget: RetryBudget, tries: int = 1000) -> int:
    """How many retries the budget grants before refusing (it refuses from then on)."""
    granted = 0
    for _ in range(tries):
        if not budget.try_retry():
            break
        granted += 1
    return granted


# --- RetryBudget ---------------------------------------------------------------------------


def budget(clock: Clock, ratio: float = 0.2, floor: int = 2, window: float = 10.0) -> RetryBudget:
    cfg = RetryBudgetConfig(ratio=ratio, min_retries_per_window=floor, window=window)
    return RetryBudget(cfg, clock=clock)


def test_budget_caps_retries_at_ratio_of_requests_plus_floor() -> None:
    clock = Clock()
    b = budget(clock, ratio=0.2, floor=2)
    for _ in range(20):
        b.record_request()
    assert spend(b) == 6  # 0.2 * 20 + 2
    assert b.try_retry() is False
    assert b.refused == 2


def test_budget_floor_lets_a_quiet_server_be_retried() -> None:
    b = budget(Clock(), ratio=0.2, floor=3)
    assert spend(b) == 3


def test_budget_grows_with_new_requests() -> None:
    clock = Clock()
    b = budget(clock, ratio=0.5, floor=1)
    assert spend(b) == 1
    for _ in range(10):
        b.record_request()
    assert spend(b) == 5  # 0.5 * 10 + 1 in all, one already spent


def test_budget_recovers_after_the_window() -> None:
    clock = Clock()
    b = budget(clock, ratio=0.2, floor=2, window=10)
    for _ in range(20):
        b.record_request()
    assert spend(b) == 6
    clock.advance(5)
    assert b.try_retry() is False  # the spent retries are still inside the window
    clock.advance(7)
    # The old requests and retries have left the window: only the floor is left, and all of it.
    assert spend(b) == 2


def test_budget_window_slides_bucket_by_bucket() -> None:
    clock = Clock()
    b = budget(clock, ratio=0.2, floor=0, window=10)
    for _ in range(50):
        b.record_request()
    assert spend(b) == 10  # 0.2 * 50
    clock.advance(6)
    for _ in range(10):
        b.record_request()  # 2 more retries are allowed now; keep them
    clock.advance(5.5)  # the first 50 requests and the 10 retries have left the window
    assert spend(b) == 2  # 0.2 * 10


def test_disabled_budget_always_allows() -> None:
    b = RetryBudget(RetryBudgetConfig(enabled=False, ratio=0, min_retries_per_window=0))
    assert spend(b, 100) == 100


def test_zero_budget_never_allows() -> None:
    b = budget(Clock(), ratio=0, floor=0)
    for _ in range(100):
        b.record_request()
    assert spend(b) == 0


# --- CircuitBreaker ------------------------------------------------------------------------


def breaker(clock: Clock, **cfg: float) -> CircuitBreaker:
    defaults: dict[str, float] = {"consecutive_failures": 3, "cooldown": 5.0, "min_requests": 1000}
    return CircuitBreaker("model", BreakerConfig(**{**defaults, **cfg}), clock=clock)


def test_breaker_opens_after_consecutive_failures_and_rejects() -> None:
    cb = breaker(Clock(), consecutive_failures=3)
    for _ in range(2):
        assert cb.allow()
        cb.record(False)
    assert cb.state == CLOSED
    cb.record(False)
    assert cb.state == OPEN
    assert cb.opened == 1
    assert [cb.allow() for _ in range(5)] == [False] * 5
    assert cb.rejected == 5


def test_breaker_admits_answers_without_letting_a_call_through() -> None:
    clock = Clock()
    br = CircuitBreaker("env", BreakerConfig(consecutive_failures=1, cooldown=5), clock)
    assert br.admits() == READY
    br.record(False)
    assert br.admits() == SHUT
    clock.advance(5)
    assert (br.admits(), br.admits(), br.state) == (PROBE, PROBE, OPEN)  # asking changes nothing
    assert br.allow()  # the probe goes: half-open, and no second probe is admitted
    assert (br.state, br.admits()) == (HALF_OPEN, SHUT)
    br.release()
    assert br.admits() == PROBE
    assert br.allow()
    br.record(True)
    assert br.admits() == READY


def test_breaker_success_resets_the_failures_in_a_row() -> None:
    cb = breaker(Clock(), consecutive_failures=3)
    for ok in (False, False, True, False, False, True, False, False):
        cb.record(ok)
    assert cb.state == CLOSED
    assert cb.allow()


def test_breaker_half_open_probe_success_closes() -> None:
    clock = Clock()
    cb = breaker(clock, consecutive_failures=2, cooldown=5)
    cb.record(False)
    cb.record(False)
    clock.advance(4.9)
    assert cb.allow() is False
    clock.advance(0.2)
    assert cb.allow() is True  # the one probe
    assert cb.state == HALF_OPEN
    assert cb.allow() is False  # nothing else while the probe is out
    cb.record(True)
    assert cb.state == CLOSED
    assert all(cb.allow() for _ in range(10))
    # Closed anew: it takes a full run of failures to open again.
    cb.record(False)
    assert cb.state == CLOSED


def test_breaker_half_open_probe_failure_reopens_for_another_cooldown() -> None:
    clock = Clock()
    cb = breaker(clock, consecutive_failures=2, cooldown=5)
    cb.record(False)
    cb.record(False)
    clock.advance(5)
    assert cb.allow() is True
    cb.record(False)
    assert cb.state == OPEN
    assert cb.opened == 2
    clock.advance(4)
    assert cb.allow() is False
    clock.advance(1)
    assert cb.allow() is True
    assert cb.state == HALF_OPEN


def test_breaker_released_probe_lets_another_probe_through() -> None:
    clock = Clock()
    cb = breaker(clock, consecutive_failures=1, cooldown=1)
    cb.record(False)
    clock.advance(1)
    assert cb.allow() is True
    assert cb.allow() is False
    cb.release()  # the probe was cancelled and will never report
    assert cb.allow() is True


def test_breaker_opens_on_failure_rate_once_min_requests_are_seen() -> None:
    clock = Clock()
    cb = breaker(clock, consecutive_failures=100, failure_rate=0.5, min_requests=10, window=30)
    for i in range(9):
        cb.record(i % 2 == 1)  # F S F S ... : 5 failures of 9
        clock.advance(1)
    assert cb.state == CLOSED  # 5 of 9 failed, but fewer than min_requests
    cb.record(True)  # 5 of 10 failed: 0.5 >= failure_rate
    assert cb.state == OPEN
    assert cb.opened == 1


def test_breaker_stays_closed_below_the_failure_rate() -> None:
    cb = breaker(Clock(), consecutive_failures=100, failure_rate=0.5, min_requests=10, window=30)
    for i in range(40):
        cb.record(i % 3 != 0)  # a third fail
    assert cb.state == CLOSED


def test_breaker_rate_counts_only_the_window() -> None:
    clock = Clock()
    cb = breaker(clock, consecutive_failures=100, failure_rate=0.5, min_requests=10, window=10)
    for _ in range(9):
        cb.record(False)
    clock.advance(11)  # those failures age out
    for _ in range(9):
        cb.record(True)
    cb.record(False)
    assert cb.state == CLOSED  # 1 of 10 in the window


def test_disabled_breaker_never_opens() -> None:
    cb = CircuitBreaker("m", BreakerConfig(enabled=False, consecutive_failures=1))
    for _ in range(10):
        cb.record(False)
    assert cb.allow()


# --- against real servers ------------------------------------------------------------------


async def test_budget_bounds_the_retries_a_half_failing_server_sees() -> None:
    rng = random.Random(20240601)
    script = Script(gen=lambda n: 503 if rng.random() < 0.5 else 200)
    calls, ratio, floor = 200, 0.2, 3
    policy = fast_policy(
        max_attempts=3,
        budget={"ratio": ratio, "min_retries_per_window": floor, "window": 30},
    )
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        results = await asyncio.gather(
            *(client.call(tgt, "/gen", {"i": i}) for i in range(calls)), return_exceptions=True
        )
        stats = client.stats()["model"]
    retries_seen = script.hits["/gen"] - calls
    assert 0 < retries_seen <= ratio * calls + floor
    assert stats.retries == retries_seen
    exhausted = [r for r in results if isinstance(r, BudgetExhausted)]
    assert exhausted, "a 50% outage with a 20% budget must refuse some retries"
    assert stats.budget_refused == len(exhausted)
    for err in exhausted:
        assert err.server == "model" and err.status == 503
        assert isinstance(err.origin, HTTPStatusError) and err.origin.status == 503
        assert pickle.loads(pickle.dumps(err)) == err
    ok = [r for r in results if isinstance(r, dict)]
    others = [r for r in results if not isinstance(r, (dict, BudgetExhausted))]
    assert ok
    # Anything else ran out of attempts on 503s within the budget: nothing is an unexpected type.
    assert all(isinstance(r, HTTPStatusError) and r.attempts == 3 for r in others), others


async def test_breaker_opens_on_an_always_failing_server_and_stops_sending() -> None:
    script = Script(gen=lambda n: Reply(503, b"down"))
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 5, "cooldown": 60})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(5):
            with pytest.raises(HTTPStatusError):
                await client.call(tgt, "/gen", {})
        assert script.hits["/gen"] == 5
        cb = client.breaker("model")
        assert cb is not None and cb.state == OPEN
        rejected = []
        for _ in range(10):
            with pytest.raises(CircuitOpen) as info:
                await client.call(tgt, "/gen", {})
            rejected.append(info.value)
        stats = client.stats()["model"]
    assert script.hits["/gen"] == 5  # the server saw nothing more
    assert stats.circuit_rejected == 10
    err = rejected[-1]
    assert err.server == "model" and err.endpoint == "/gen" and err.retryable is False
    assert pickle.loads(pickle.dumps(err)) == err


async def test_breaker_counts_failed_calls_not_attempts() -> None:
    # Retries that a call absorbs are no reason to open the circuit: two calls of five failed
    # attempts each are two failures, and only then does the breaker open.
    script = Script(gen=lambda n: Reply(503, b"down"))
    policy = fast_policy(max_attempts=5, breaker={"consecutive_failures": 2, "cooldown": 60})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(2):
            with pytest.raises(HTTPStatusError) as failed:
                await client.call(tgt, "/gen", {})
            assert failed.value.attempts == 5
        assert script.hits["/gen"] == 10
        with pytest.raises(CircuitOpen):
            await client.call(tgt, "/gen", {})
    assert script.hits["/gen"] == 10  # not sent


async def test_gateway_errors_do_not_open_the_gateways_breaker() -> None:
    # An agent answering 502 for a broken model is healthy itself: its callers must not cut it
    # off (the model has a breaker of its own, inside the agent).
    body = b'{"error": {"type": "upstream_error", "message": "model failed", "status": 502,'
    body += b' "server": "agent", "retryable": false, "origin": {"type": "http_status",'
    body += b' "message": "model answered 500", "status": 500, "server": "model"}}}'
    script = Script(run=lambda n: Reply(502, body))
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 2, "cooldown": 60})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("agent", url, policy)
        for _ in range(5):
            with pytest.raises(HTTPStatusError) as failed:
                await client.call(tgt, "/run", {})
            assert failed.value.root().server == "model"
        cb = client.breaker("agent")
    assert cb is not None and cb.state == CLOSED
    assert script.hits["/run"] == 5


async def test_successes_between_failures_keep_the_breaker_closed() -> None:
    # Two failures, one success, over and over: never three failures in a row.
    script = Script(gen=lambda n: 200 if n % 3 == 0 else 503)
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 3, "cooldown": 60})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(12):
            with contextlib.suppress(HTTPStatusError):
                await client.call(tgt, "/gen", {})
        cb = client.breaker("model")
    assert cb is not None and cb.state == CLOSED
    assert script.hits["/gen"] == 12


@pytest.mark.parametrize("probe_status", [200, 404])
async def test_half_open_probe_answered_closes_the_breaker(probe_status: int) -> None:
    # A probe that is answered at all (even with a caller's 4xx) shows the server is back.
    # The cooldown outlasts the calls that expect the circuit open, on a busy machine too.
    script = Script(gen=[503, 503, probe_status])
    script.plan("/gen", script.plans["/gen"], default=200)
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 2, "cooldown": 2.0})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(2):
            with pytest.raises(HTTPStatusError):
                await client.call(tgt, "/gen", {})
        with pytest.raises(CircuitOpen):
            await client.call(tgt, "/gen", {})
        await asyncio.sleep(2.1)  # past the cooldown (load only adds)
        if probe_status == 200:
            await client.call(tgt, "/gen", {})
        else:
            with pytest.raises(HTTPStatusError):
                await client.call(tgt, "/gen", {})
        for _ in range(5):
            await client.call(tgt, "/gen", {})
        cb = client.breaker("model")
    assert cb is not None and cb.state == CLOSED
    assert script.hits["/gen"] == 8


async def test_half_open_probe_failure_reopens_the_breaker() -> None:
    script = Script(gen=lambda n: 503)
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 2, "cooldown": 2.0})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(2):
            with pytest.raises(HTTPStatusError):
                await client.call(tgt, "/gen", {})
        await asyncio.sleep(2.1)  # past the cooldown (load only adds)
        with pytest.raises(HTTPStatusError):
            await client.call(tgt, "/gen", {})  # the probe, sent and failed
        with pytest.raises(CircuitOpen):
            await client.call(tgt, "/gen", {})
        cb = client.breaker("model")
    assert cb is not None and cb.state == OPEN and cb.opened == 2
    assert script.hits["/gen"] == 3


async def test_cancelled_probe_does_not_keep_the_circuit_shut() -> None:
    script = Script(fail=lambda n: 503, slow=lambda n: Reply(200, delay=5), ok=lambda n: 200)
    policy = fast_policy(max_attempts=1, breaker={"consecutive_failures": 2, "cooldown": 0.2})
    async with serve_script(script) as url, HttpClient() as client:
        tgt = Target.single("model", url, policy)
        for _ in range(2):
            with pytest.raises(HTTPStatusError):
                await client.call(tgt, "/fail", {})
        await asyncio.sleep(0.3)
        probe = asyncio.create_task(client.call(tgt, "/slow", {}))
        await wait_until(lambda: script.hits["/slow"] == 1)
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        assert (await client.call(tgt, "/ok", {}))["ok"] is True
        cb = client.breaker("model")
    assert cb is not None and cb.state == CLOSED
