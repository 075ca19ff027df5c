"""The run-level failure budget: when a run stops, and what its abort summary says."""

from __future__ import annotations

from typing import Any

from rollgym.collect.failure_budget import FailureBudget
from rollgym.config import CollectConfig
from rollgym.errors import ConnectError, HTTPStatusError, RollgymError


def model_error(status: int, body: str = '{"error": "NaN in logprobs"}') -> RollgymError:
    """A model failure as the collector sees it: the agent's 502 with the model's error inside."""
    origin = HTTPStatusError(
        f"model answered {status}", status=status, server="model", endpoint="/v1/responses",
        body=body, attempts=3,
    )  # fmt: skip
    return HTTPStatusError("agent answered 502", status=502, server="agent", origin=origin)


def budget(**cfg: Any) -> FailureBudget:
    return FailureBudget(CollectConfig.model_validate(cfg))


def test_no_limits_never_abort() -> None:
    b = budget(max_failure_rate=None)
    assert all(b.observe(model_error(500)) is None for _ in range(100))


def test_default_budget_stops_a_broken_run_after_50_samples() -> None:
    b = budget()
    assert all(b.observe(model_error(500)) is None for _ in range(49))
    assert b.observe(model_error(500)) == (
        "50 of the last 50 rollouts failed, rate 100% >= --max-failure-rate 0.5; "
        "by root cause: http_status 50"
    )


def test_default_budget_tolerates_a_minority_of_failures() -> None:
    b = budget()
    outcomes = [model_error(500) if i % 3 == 0 else None for i in range(300)]
    assert all(b.observe(e) is None for e in outcomes)


def test_max_failures_counts_failures_only() -> None:
    b = budget(max_failures=3)
    assert [b.observe(e) for e in (None, model_error(500), None, model_error(500))] == [None] * 4
    reason = b.observe(model_error(503))
    assert reason == "3 rollouts failed (--max-failures 3); by root cause: http_status 3"
    summary = b.summary.to_dict()
    assert summary["by_server"] == {"model": 3}
    assert summary["by_status"] == {"500": 2, "503": 1}
    assert summary["max_attempts_per_request"] == 3
    assert summary["sample_error"]["server"] == "model"
    assert "NaN in logprobs" in summary["sample_error"]["body"]


def test_failure_rate_waits_for_enough_samples() -> None:
    b = budget(max_failure_rate=0.5, min_failure_samples=10)
    for _ in range(9):
        assert b.observe(ConnectError("refused", server="model")) is None
    assert b.observe(None) is None  # judged on a failure: a success never aborts a run
    reason = b.observe(ConnectError("refused", server="model"))
    assert reason is not None and "10 of the last 11 rollouts failed" in reason


def test_a_404_early_is_a_configuration_error_but_not_later() -> None:
    early = budget(config_error_window=2)
    reason = early.observe(model_error(404, body="Not Found"))
    assert reason is not None
    assert reason.startswith("configuration error: model answered 404 on /v1/responses")
    late = budget(config_error_window=2)
    late.observe(None)
    late.observe(None)
    assert late.observe(model_error(404)) is None  # a task-specific 404, not a wrong URL
