"""The retry decision as a pure function: every rule of the README's retry table, one row each."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rollgym.config import RetryPolicy
from rollgym.errors import (
    ConnectError,
    ConnectionLost,
    DeadlineExceeded,
    HTTPStatusError,
    InternalError,
    ProtocolError,
    ReadTimeout,
    RollgymError,
)
from rollgym.http.classify import Decision, blames_server, classify
from rollgym.http.policy import backoff

WHERE: dict[str, Any] = {"server": "m", "endpoint": "/gen", "method": "POST", "url": "http://m"}


def status(code: int, **extra: Any) -> HTTPStatusError:
    return HTTPStatusError(f"m answered {code}", status=code, **WHERE, **extra)


def decide(
    err: RollgymError,
    *,
    idempotent: bool = False,
    max_attempts: int = 3,
    attempt: int = 1,
    time_left: float = 100.0,
    policy: RetryPolicy | None = None,
    **kwargs: Any,
) -> Decision:
    return classify(
        err,
        policy or RetryPolicy(backoff_initial=0.1, backoff_max=0.1),
        idempotent=idempotent,
        max_attempts=max_attempts,
        attempt=attempt,
        time_left=time_left,
        deadline=100.0,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("err", "idempotent", "retry"),
    [
        (ConnectError("refused", **WHERE), False, True),
        (ConnectError("bad url", retryable=False, **WHERE), True, False),
        (status(502), False, True),
        (status(503), False, True),
        (status(504), False, True),
        (status(500), False, False),
        (status(500), True, True),
        (ConnectionLost("reset", **WHERE), False, False),
        (ConnectionLost("reset", **WHERE), True, True),
        (ReadTimeout("slow", **WHERE), False, False),
        (ReadTimeout("slow", **WHERE), True, True),
        (ProtocolError("garbled 2xx", status=200, **WHERE), False, False),
        (ProtocolError("garbled 2xx", status=200, **WHERE), True, True),
        (status(400), True, False),
        (status(404), True, False),
        (status(429), True, False),  # not listed
        (status(501), True, False),  # a 5xx not in retry_statuses
        (InternalError("bug", **WHERE), True, False),
    ],
)
def test_which_failures_are_retried(err: RollgymError, idempotent: bool, retry: bool) -> None:
    decision = decide(err, idempotent=idempotent)
    assert decision.retry is retry
    assert decision.error.retryable is retry
    assert decision.error.attempts == 1


def test_408_and_429_are_retried_only_when_listed() -> None:
    listed = RetryPolicy(retry_4xx=(408, 429))
    assert decide(status(429), policy=listed).retry
    assert decide(status(408), policy=listed).retry
    assert not decide(status(429)).retry
    assert not decide(status(418), policy=listed).retry


def test_retry_after_is_a_floor_under_the_backoff_up_to_the_cap() -> None:
    policy = RetryPolicy(retry_4xx=(429,), retry_after_cap=30, backoff_initial=0.1)
    within = decide(status(429), policy=policy, retry_after=7.0)
    assert within.retry and within.delay == 7.0
    past = decide(status(429), policy=policy, retry_after=31.0)
    assert not past.retry
    # Still a transient failure, so a caller may run the whole thing again later.
    assert past.error.retryable is True and past.error.attempts == 1


def test_a_body_declared_final_is_not_retried() -> None:
    decision = decide(status(503), final=True)
    assert not decision.retry and decision.error.retryable is False


def test_attempts_used_up_is_final_but_still_retryable() -> None:
    decision = decide(status(503), attempt=3, max_attempts=3)
    assert not decision.retry
    assert decision.error.attempts == 3 and decision.error.retryable is True


def test_backoff_comes_from_the_injected_rng() -> None:
    policy = RetryPolicy(backoff_initial=1.0, backoff_multiplier=2.0, backoff_max=10.0)
    decision = decide(status(503), policy=policy, attempt=2, rng=random.Random(7))
    assert decision.delay == backoff(policy, 2, random.Random(7))
    assert 0 <= decision.delay <= 2.0


def test_no_time_left_for_the_delay_is_deadline_exceeded() -> None:
    policy = RetryPolicy(backoff_initial=0.0, backoff_max=0.0)
    err = status(503, body="busy")
    decision = decide(err, policy=policy, retry_after=5.0, time_left=4.0)
    assert not decision.retry
    ran_out = decision.error
    assert isinstance(ran_out, DeadlineExceeded)
    assert (ran_out.server, ran_out.endpoint, ran_out.attempts) == ("m", "/gen", 1)
    assert ran_out.retryable is False
    assert isinstance(ran_out.origin, HTTPStatusError) and ran_out.origin.body == "busy"


def test_a_read_timeout_that_had_only_the_deadline_left_is_deadline_exceeded() -> None:
    err = ReadTimeout("slow", **WHERE)
    decision = decide(err, idempotent=True, attempt=2, timeout_was_deadline=True)
    assert not decision.retry
    assert isinstance(decision.error, DeadlineExceeded)
    assert decision.error.attempts == 2 and decision.error.origin == err
    assert decision.blame is True


def test_the_attempts_error_is_never_changed_in_place() -> None:
    err = status(503)
    before = err.to_dict()
    for decision in (decide(err), decide(err, attempt=3), decide(err, final=True)):
        assert decision.error is not err
    assert err.to_dict() == before


@pytest.mark.parametrize(
    ("err", "blamed"),
    [
        (status(500), True),
        (status(503), True),
        (status(404), False),
        (status(429), False),
        (ConnectError("refused", **WHERE), True),
        (ConnectionLost("reset", **WHERE), True),
        (ReadTimeout("slow", **WHERE), True),
        (ProtocolError("garbled", **WHERE), True),
        # A gateway's 502 for another server's failure: the gateway is healthy.
        (status(502, origin=HTTPStatusError("boom", status=500, server="model")), False),
        # Its own failure, reported with an origin of its own: still its fault.
        (status(502, origin=InternalError("crash", server="m")), True),
    ],
)
def test_blame(err: RollgymError, blamed: bool) -> None:
    assert blames_server(err) is blamed
    assert decide(err).blame is blamed
