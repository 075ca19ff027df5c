"""What a batch of groups cost, for a trainer: per rollout, and per useful trained sample.

    groups = client.collect_sync(rows, repeats=8)
    cost = BatchCost.of(groups, prices)          # prices: a PriceTable, or None (tokens only)
    cost.per_useful_sample                       # {"tokens": ..., "money": ...}

Each record's cost is read as the run's ledger reads it (``rollgym.collect.cost``). A useful
sample is a scored rollout (not failed, masked or stale) of a group that carries a learning
signal: a group of one, or one whose scored rewards are not all equal (GRPO learns nothing
from a group of equal rewards). Failed, stale and replaced rollouts count in the batch's cost,
never as useful: with what they spent where their agent said so (a rollgym agent's error
answer, a stale rollout's own record), else as ``unmetered`` (never as free).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rollgym.collect.cost import rollout_cost, tokens_of
from rollgym.config import PriceTable
from rollgym.trainer.group import TaskGroup


@dataclass(frozen=True)
class BatchCost:
    """The cost of a batch of groups (see the module docstring)."""

    rollouts: int
    useful: int
    tokens: int
    money: float | None
    sandbox_s: float
    """Sandbox CPU seconds (the records' ``sandbox_s``)."""
    judge_calls: int
    """Judge calls, failed ones that may have been billed among them (``judge_failed_calls``)."""
    unmetered: int
    """Rollouts with a call (model or judge) whose tokens are not known."""
    judge_failed_calls: int = 0

    @classmethod
    def of(cls, groups: Iterable[TaskGroup], prices: PriceTable | None = None) -> BatchCost:
        rollouts = useful = tokens = judge_calls = judge_failed = unmetered = 0
        spent, sandbox = 0.0, 0.0
        for group in groups:
            scored = group.scored
            signal = len(group.rollouts) == 1 or len({r.reward for r in scored}) > 1
            useful += len(scored) if signal else 0
            for record in (*group.rollouts, *group.replaced):
                cost = rollout_cost(record, prices)
                rollouts += 1
                tokens += tokens_of(cost)
                spent += float(cost.get("money", 0.0))
                sandbox += float(cost.get("sandbox_s", 0.0))
                judge_calls += int(cost.get("judge_calls", 0))
                judge_failed += int(cost.get("judge_failed_calls", 0))
                unmetered += (
                    cost.get("metered") is False
                    or bool(cost.get("unmetered_calls"))
                    or bool(cost.get("judge_unmetered_calls"))
                )
        return cls(rollouts, useful, tokens, spent if prices is not None else None, sandbox,
                   judge_calls, unmetered, judge_failed)  # fmt: skip

    def _per(self, n: int) -> dict[str, Any]:
        if n == 0:
            return {"tokens": None, "money": None}
        money = None if self.money is None else self.money / n
        return {"tokens": self.tokens / n, "money": money}

    @property
    def per_rollout(self) -> dict[str, Any]:
        """The batch's tokens and money over its rollouts."""
        return self._per(self.rollouts)

    @property
    def per_useful_sample(self) -> dict[str, Any]:
        """The batch's tokens and money over its useful trained samples (None: none)."""
        return self._per(self.useful)
