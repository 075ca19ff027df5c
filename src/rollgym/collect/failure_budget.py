"""The run-level failure budget: stop a run whose servers are truly broken, fast.

Crossing ``max_failures``, or a failure rate of ``max_failure_rate`` once ``min_samples``
rollouts have finished, aborts the run. A 401/403/404 among the first ``config_error_window``
finished rollouts is a configuration error (wrong URL, key or route): abort at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollgym.config import CollectConfig
from rollgym.errors import RollgymError

CONFIG_STATUSES = (401, 403, 404)


@dataclass
class FailureSummary:
    """What failed so far, for the abort message and ``run.json``."""

    by_server: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_type: Counter[str] = field(default_factory=Counter)
    sample: dict[str, Any] | None = None
    max_attempts: int = 0

    def add(self, err: RollgymError) -> None:
        root = err.root()
        self.by_server[root.server or "?"] += 1
        self.by_status[str(root.status) if root.status is not None else root.type] += 1
        self.by_type[root.type] += 1
        self.max_attempts = max(self.max_attempts, root.attempts, err.attempts)
        if self.sample is None or (root.body and not self.sample.get("body")):
            self.sample = {
                "type": root.type,
                "server": root.server,
                "endpoint": root.endpoint,
                "status": root.status,
                "message": root.message,
                "body": (root.body or "")[:500],
                "attempts": root.attempts,
            }

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_server": dict(self.by_server),
            "by_status": dict(self.by_status),
            "by_type": dict(self.by_type),
            "max_attempts_per_request": self.max_attempts,
            "sample_error": self.sample,
        }


@dataclass(frozen=True, slots=True)
class BudgetRules:
    """When a run (or a trainer's batch) is judged broken; None turns a rule off."""

    max_failures: int | None = None
    max_failure_rate: float | None = 0.5
    min_failure_samples: int = 50
    config_error_window: int = 5

    @classmethod
    def from_collect(cls, cfg: CollectConfig) -> BudgetRules:
        return cls(
            cfg.max_failures, cfg.max_failure_rate, cfg.min_failure_samples,
            cfg.config_error_window,
        )  # fmt: skip


class FailureBudget:
    def __init__(self, rules: BudgetRules | CollectConfig) -> None:
        self.config = rules if isinstance(rules, BudgetRules) else BudgetRules.from_collect(rules)
        self.finished = 0
        self.failed = 0
        self.summary = FailureSummary()

    def observe(self, err: RollgymError | None) -> str | None:
        """Count one finished rollout; return the reason to abort, or None to go on."""
        self.finished += 1
        if err is None:
            return None
        self.failed += 1
        self.summary.add(err)
        root = err.root()
        cfg = self.config
        if (
            root.status in CONFIG_STATUSES
            and root.type != "invalid_request"  # a rollgym server's own 404 (unknown session)
            and self.finished <= cfg.config_error_window
        ):
            return (
                f"configuration error: {root.server or 'a server'} answered {root.status} on "
                f"{root.endpoint or 'a request'} ({root.message})"
            )
        if cfg.max_failures is not None and self.failed >= cfg.max_failures:
            return f"{self.failed} rollouts failed (--max-failures {cfg.max_failures})"
        if (
            cfg.max_failure_rate is not None
            and self.finished >= cfg.min_failure_samples
            and self.failed / self.finished >= cfg.max_failure_rate
        ):
            return (
                f"{self.failed}/{self.finished} rollouts failed, rate "
                f"{self.failed / self.finished:.0%} >= --max-failure-rate {cfg.max_failure_rate:g}"
            )
        return None
