"""A server that goes down and stays down stops the run fast, whatever the run's history: the
failure rate is taken over recent outcomes, and an open circuit that holds every rollout with
no success in between is itself a reason to stop. A short outage loses nothing."""

from __future__ import annotations

import pytest

from rollgym.collect.failure_budget import CIRCUIT_ABORT_AFTER, BudgetRules, FailureBudget
from rollgym.errors import CircuitOpen, HTTPStatusError, RollgymError


def model_down() -> RollgymError:
    origin = HTTPStatusError("model answered 503", status=503, server="model", attempts=3)
    return HTTPStatusError("agent answered 502", status=502, server="agent", origin=origin)


def circuit_open() -> RollgymError:
    origin = CircuitOpen("circuit for model is open; not sent", server="model")
    return HTTPStatusError("agent answered 502", status=502, server="agent", origin=origin)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("history", [0, 500, 200_000])
def test_failures_after_any_history_abort_within_one_window(history: int) -> None:
    budget = FailureBudget(BudgetRules(window=50))
    for _ in range(history):
        assert budget.observe(None) is None
    failures = 0
    reason = None
    while reason is None:
        failures += 1
        reason = budget.observe(model_down())
        assert failures <= 50, "the rate must be taken over recent outcomes"
    # Half of the last 50 is the default rate: 25 failures after a clean history.
    assert failures == (50 if history == 0 else 25)
    assert "of the last 50 rollouts failed" in reason


def test_the_window_outgrows_the_failures_a_short_outage_causes() -> None:
    """At concurrency 64 a blip fails the 64 rollouts in flight at once: not half a window."""
    rules = BudgetRules().for_concurrency(64)
    assert rules.window == 256
    budget = FailureBudget(rules)
    for _ in range(1000):
        budget.observe(None)
    assert all(budget.observe(model_down()) is None for _ in range(64))
    # A server that stays down (its breaker disabled, so every rollout fails fast) still
    # trips the rule within one window.
    failures = 64
    while budget.observe(model_down()) is None:
        failures += 1
    assert failures + 1 == 128  # the 128th failure is half of the window


def test_a_circuit_that_holds_every_rollout_aborts_after_its_limit() -> None:
    clock = Clock()
    budget = FailureBudget(BudgetRules(), clock=clock)
    started, reason = clock.now, None
    while reason is None:  # a hold every 0.5 s, no success
        reason = budget.observe_hold(circuit_open())
        clock.now += 0.5
        assert clock.now - started < 60
    assert clock.now - 0.5 - started == pytest.approx(CIRCUIT_ABORT_AFTER)
    assert reason.startswith("model stayed down")
    assert budget.summary.to_dict()["by_type"] == {"circuit_open": 1}


def test_a_success_or_a_quiet_spell_ends_a_streak_of_holds() -> None:
    clock = Clock()
    budget = FailureBudget(BudgetRules(), clock=clock)
    for _ in range(6):  # 5 s of holds: a short outage, under the limit
        assert budget.observe_hold(circuit_open()) is None
        clock.now += 1.0
    assert budget.observe(None) is None  # the probe got through: recovered
    for _ in range(6):
        assert budget.observe_hold(circuit_open()) is None
        clock.now += 1.0
    clock.now += CIRCUIT_ABORT_AFTER  # quiet: the circuit closed, long rollouts are running
    for _ in range(6):
        assert budget.observe_hold(circuit_open()) is None
        clock.now += 1.0


def test_holds_never_abort_when_the_rule_is_off() -> None:
    clock = Clock()
    budget = FailureBudget(BudgetRules(circuit_abort_after=None), clock=clock)
    for _ in range(100):
        assert budget.observe_hold(circuit_open()) is None
        clock.now += 1.0
