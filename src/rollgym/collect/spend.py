"""What each record adds to its line (its cost, its environment's fingerprint), and the run's
budget (``collect.budget``), kept as the records are written.

The ledger asks ``RunSpend.stamp`` for the extra fields of each line it writes, once per
record, after its duplicate check (a record's cost is counted once): ``rollgym_fingerprint``
(the short id of the fingerprint in ``run.json``), and ``rollgym_cost`` where the record's own
(its agent's) needs its money added or is missing (``rollgym.collect.cost``). The spend so far (every session's, read back on ``--resume``) is held against
the caps; the first cap reached sets ``stop_reason`` and calls ``on_cap`` once: the collector
then stops sending rollouts, and lets those in flight finish or cancels them
(``budget.in_flight``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollgym.collect.cost import rollout_cost, tokens_of
from rollgym.collect.cost_ledger import CostLedger, line_cost
from rollgym.collect.failure_budget import is_stale
from rollgym.collect.layout import RunDir, read_ledger
from rollgym.collect.records import RolloutRecord, ScoredRollout
from rollgym.config import BudgetConfig, PriceTable
from rollgym.wire import COST_FIELD, FINGERPRINT_FIELD


def _no_fingerprint(task_index: int) -> str | None:
    return None


class RunSpend:
    """A run's spend against its budget (None: no caps), and the stamp of its lines."""

    def __init__(
        self, prices: PriceTable | None, budget: BudgetConfig | None, repeats: int = 1
    ) -> None:
        self.prices = prices
        self.budget = budget
        self.tokens = 0
        self.money = 0.0
        self.sandbox_s = 0.0  # CPU seconds, as the records' ``sandbox_s``
        self.stop_reason: str | None = None
        """Why the run stopped at its budget (None: it has not)."""
        self.abandoned = 0
        """Rollouts started (sent to their agent) and cancelled unrecorded at the cap
        (``in_flight: abandon``): what they spent is in no record. Not those never started."""
        self.on_cap: Callable[[str], None] | None = None
        self.fingerprint_of: Callable[[int], str | None] = _no_fingerprint
        """The fingerprint id of the environment that scores task ``i``."""
        self.ledger = CostLedger(repeats)
        """The run's cost ledger (``cost.json``), kept as the lines are written."""

    def load(self, out_dir: Path) -> None:
        """Count what the run's earlier sessions spent (``--resume``): a budget and a ledger
        are the run's. A fresh run's files are empty: nothing is read."""
        self.ledger.load(out_dir)
        if self.budget is not None:
            files = RunDir(out_dir)
            for path in (files.rollouts, files.failures, files.failures_history, files.stale):
                for got in read_ledger(path):
                    self._add(line_cost(got.record))
            self._check()

    def stamp(self, record: RolloutRecord) -> dict[str, Any] | None:
        """The fields ``record``'s line gets beside its own (None: none); its cost is spent.
        Kept cheap: a rollgym agent's cost is on the record already, and is read again only
        for the money of a priced run or the spend of a budgeted one."""
        extra: dict[str, Any] | None = None
        if isinstance(record, ScoredRollout):
            cost: Any = record.verified.get(COST_FIELD)
            task, reward, masked, attempts = (
                record.task_index, record.reward, record.masked, record.attempts,
            )  # fmt: skip
            try:
                if self.prices is not None:  # the cost with its money: a new field
                    cost = rollout_cost(record, self.prices)
                    extra = {COST_FIELD: cost}
                self.ledger.scored(task, reward, masked, cost, attempts)
            except (TypeError, AttributeError):  # a cost no rollgym agent wrote
                cost = rollout_cost(record, self.prices)
                extra = {COST_FIELD: cost}
                self.ledger.scored(task, reward, masked, cost, attempts)
        else:
            cost = rollout_cost(record, self.prices)  # what it spent, if known; else FAILED
            extra = {COST_FIELD: cost}
            cause = "stale" if is_stale(record.error) else "failed"
            # Its seconds as its line says them: the ledger read back from the files agrees.
            self.ledger.unscored(cause, cost, record.attempts, round(record.duration_s, 4))
        if self.budget is not None:
            # Spent after the cap too (in flight, finished): run.json's figures agree with cost.json.
            self._add(cost)
            if self.stop_reason is None:
                self._check()
        fingerprint = self.fingerprint_of(record.task_index)
        if fingerprint is not None:
            if extra is None:
                return {FINGERPRINT_FIELD: fingerprint}
            extra[FINGERPRINT_FIELD] = fingerprint
        return extra

    def _add(self, cost: dict[str, Any]) -> None:
        self.tokens += tokens_of(cost)
        self.money += float(cost.get("money", 0.0))
        self.sandbox_s += float(cost.get("sandbox_s", 0.0))

    def _check(self) -> None:
        cap = self.budget
        if cap is None or self.stop_reason is not None:
            return
        reason = None
        if cap.tokens is not None and self.tokens >= cap.tokens:
            reason = f"collect.budget.tokens: {self.tokens:,} tokens spent (cap {cap.tokens:,})"
        elif cap.money is not None and self.money >= cap.money:
            currency = self.prices.currency if self.prices is not None else ""
            reason = f"collect.budget.money: {self.money:.4f} {currency} spent (cap {cap.money:g})"
        elif cap.sandbox_seconds is not None and self.sandbox_s >= cap.sandbox_seconds:
            reason = (
                f"collect.budget.sandbox_seconds: {self.sandbox_s:.1f} sandbox CPU seconds spent "
                f"(cap {cap.sandbox_seconds:g})"
            )
        if reason is None:
            return
        self.stop_reason = reason
        if self.on_cap is not None:
            self.on_cap(reason)

    def summary(self, pending: int = 0) -> dict[str, Any]:
        """For ``run.json``'s ``budget`` once the run stopped at it; ``pending``: the run's
        rollouts not recorded, ``abandoned`` (started, cancelled: their spend is not known)
        plus ``not_started`` (nothing spent); ``--resume`` runs both."""
        out: dict[str, Any] = {"reason": self.stop_reason, "tokens": self.tokens,
                               "sandbox_s": round(self.sandbox_s, 3)}  # fmt: skip
        if self.prices is not None:
            out["money"] = round(self.money, 6)
        if self.budget is not None:
            out["in_flight"] = self.budget.in_flight
            out["abandoned"] = self.abandoned
            out["not_started"] = max(0, pending - self.abandoned)
        return out
