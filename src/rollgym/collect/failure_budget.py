"""The run-level failure budget: stop a run whose servers are truly broken, fast.

Three rules, each independent of how long the run has been going:
- ``max_failures`` failed rollouts in all;
- a failure rate of ``max_failure_rate`` among recent outcomes: the last ``window`` finished
  rollouts (at least ``min_failure_samples``, and four times the concurrency, so the rollouts
  in flight when a short outage starts, which fail together, are never half of it), judged
  once ``min_failure_samples`` have finished. A server that dies after hours of good work is
  caught as fast as one that never worked;
- an open circuit that refuses every rollout for ``circuit_abort_after`` seconds with no
  success in between (the server stayed down past its breaker's probes): held rollouts record
  no outcome, so the rate alone would wait for their holds to run out.
A 401/403/404 among the first ``config_error_window`` finished rollouts is a configuration
error (wrong URL, key or route): abort at once; so is a rollout failed with a ``ConfigError``
(a server of the wrong kind, say an environment server given as an agent).

A stale rollout (``StaleRollout``: asynchronous training left it too many policy versions
behind) is no failure of any server: it is not counted at all, neither as a failure nor as a
finished rollout.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rollgym.collect.metrics import CauseCounts
from rollgym.config import CollectConfig
from rollgym.errors import RollgymError, StaleRollout, root_cause

CONFIG_STATUSES = (401, 403, 404)
CIRCUIT_ABORT_AFTER = 8.0
"""Seconds of rollouts refused by an open circuit, with no success, before a run aborts: past a
default breaker cool-down (5 s) and its probe, so an outage shorter than the cool-down loses
nothing, while a server that stays down stops the run within about 10 s of its first failure."""


@dataclass
class FailureSummary:
    """What failed so far, for the abort message and ``run.json``: by the server, status and
    type of the error where each failure started (``RollgymError.root``), and by root cause
    with its context (``by_root``, ``by_root_context``: ``rollgym.errors.root_cause``)."""

    by_server: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_type: Counter[str] = field(default_factory=Counter)
    causes: CauseCounts = field(default_factory=CauseCounts)
    sample: dict[str, Any] | None = None
    max_attempts: int = 0

    def add(self, err: RollgymError) -> None:
        root = err.root()
        cause = root_cause(err)
        self.by_server[root.server or "?"] += 1
        self.by_status[str(root.status) if root.status is not None else root.type] += 1
        self.by_type[root.type] += 1
        self.causes.add(cause.type, cause.context)
        self.max_attempts = max(self.max_attempts, root.attempts, err.attempts)
        if self.sample is None or (root.body and not self.sample.get("body")):
            self.sample = {
                "type": root.type,
                "server": root.server,
                "endpoint": root.endpoint,
                "status": root.status,
                "message": root.message,
                "body": (root.body or _cause_body(root) or "")[:500],
                "attempts": root.attempts,
                "root_cause": cause.type,
                "context": cause.context,
            }

    def describe(self) -> str:
        """The failures by root cause, the most frequent first, with their context."""
        return self.causes.describe(limit=3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "by_server": dict(self.by_server),
            "by_status": dict(self.by_status),
            "by_type": dict(self.by_type),
            "by_root": self.causes.totals(),
            "by_root_context": self.causes.contexts(),
            "max_attempts_per_request": self.max_attempts,
            "sample_error": self.sample,
        }


def _cause_body(err: RollgymError) -> str | None:
    """The first body down ``err``'s chain (a refused retry keeps none of its own)."""
    node: RollgymError | None = err
    while node is not None and not node.body:
        node = node.origin
    return None if node is None else node.body


@dataclass(frozen=True, slots=True)
class BudgetRules:
    """When a run (or a trainer's batch) is judged broken; None turns a rule off."""

    max_failures: int | None = None
    max_failure_rate: float | None = 0.5
    min_failure_samples: int = 50
    config_error_window: int = 5
    circuit_abort_after: float | None = CIRCUIT_ABORT_AFTER
    window: int | None = None
    """Recent outcomes the rate is taken over; None: ``min_failure_samples``."""

    def for_concurrency(self, concurrency: int) -> BudgetRules:
        """These rules with the window a run of ``concurrency`` rollouts in flight needs."""
        if self.window is not None:
            return self
        return replace(self, window=max(self.min_failure_samples, 4 * concurrency))

    @classmethod
    def from_collect(cls, cfg: CollectConfig) -> BudgetRules:
        rules = cls(
            cfg.max_failures, cfg.max_failure_rate, cfg.min_failure_samples,
            cfg.config_error_window,
        )  # fmt: skip
        return rules.for_concurrency(cfg.concurrency)


class FailureBudget:
    def __init__(
        self, rules: BudgetRules | CollectConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = rules if isinstance(rules, BudgetRules) else BudgetRules.from_collect(rules)
        self.clock = clock
        self.finished = 0
        self.failed = 0
        self.summary = FailureSummary()
        cfg = self.config
        # Never smaller than the samples the rate waits for, or the rule could never apply.
        window = max(cfg.window or 0, cfg.min_failure_samples)
        self._recent: deque[bool] = deque(maxlen=window)
        self._recent_failed = 0
        self._held_since: float | None = None
        self._last_hold = 0.0

    def observe(self, err: RollgymError | None) -> str | None:
        """Count one finished rollout; return the reason to abort, or None to go on."""
        if err is not None and is_stale(err):
            return None
        self.finished += 1
        failed = err is not None
        if len(self._recent) == self._recent.maxlen and self._recent[0]:
            self._recent_failed -= 1
        self._recent.append(failed)
        if err is None:
            self._held_since = None  # a success: whatever was open has recovered
            return None
        self._recent_failed += 1
        self.failed += 1
        self.summary.add(err)
        root = err.root()
        cfg = self.config
        if root.type == "config_error" and self.finished <= cfg.config_error_window:
            return f"configuration error: {root.message}"  # it says what to change
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
            return (
                f"{self.failed} rollouts failed (--max-failures {cfg.max_failures}); "
                f"by root cause: {self.summary.describe()}"
            )
        window = len(self._recent)
        if (
            cfg.max_failure_rate is not None
            and window >= cfg.min_failure_samples
            and self._recent_failed / window >= cfg.max_failure_rate
        ):
            return (
                f"{self._recent_failed} of the last {window} rollouts failed, rate "
                f"{self._recent_failed / window:.0%} >= --max-failure-rate "
                f"{cfg.max_failure_rate:g}; by root cause: {self.summary.describe()}"
            )
        return None

    def observe_hold(self, err: RollgymError) -> str | None:
        """A rollout was refused by an open circuit (and is held, not failed); return the reason
        to abort if circuits have refused rollouts, with no success, for too long."""
        limit = self.config.circuit_abort_after
        if limit is None:
            return None
        now = self.clock()
        last, self._last_hold = self._last_hold, now
        if self._held_since is None or now - last >= limit:
            # A new streak (a success ended the last one, or it went quiet: the circuit closed
            # and the rollouts it held are running, however long they take).
            self._held_since = now
            return None
        if now - self._held_since < limit:
            return None
        self.summary.add(err)
        root = err.root()
        return (
            f"{root.server or 'a server'} stayed down: every rollout for "
            f"{now - self._held_since:.0f}s was refused by its open circuit ({root.message}); "
            f"by root cause: {self.summary.describe()}"
        )


def is_stale(err: RollgymError) -> bool:
    """Whether ``err`` is a stale rollout's outcome (itself, or as the root of an agent's
    error: a model server refused the rollout's next call)."""
    return isinstance(err, StaleRollout) or err.root().type == StaleRollout.type
