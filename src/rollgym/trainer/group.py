"""A task row's group of rollouts: what the client and the stream hand the trainer.

Its own module so that the stream's feed, which builds groups, and the client, which returns
them, both import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollgym.collect.failure_budget import is_stale
from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """All rollouts of one task row (its GRPO group), ordered by ``rollout_index``.
    ``replaced``: records a stream re-ran (failed or stale; ``rollgym.trainer.stream``), kept
    for the accounting and never part of the group."""

    task_index: int
    task: dict[str, Any]
    rollouts: tuple[RolloutRecord, ...]
    replaced: tuple[RolloutRecord, ...] = ()

    @property
    def scored(self) -> list[ScoredRollout]:
        """The rollouts whose reward is a measurement (not failed, not masked)."""
        return [r for r in self.rollouts if isinstance(r, ScoredRollout) and not r.masked]

    @property
    def masked(self) -> list[ScoredRollout]:
        """The rollouts the environment asked to mask: their reward is no measurement."""
        return [r for r in self.rollouts if isinstance(r, ScoredRollout) and r.masked]

    @property
    def failed(self) -> list[FailedRollout]:
        """The rollouts that failed (stale ones are not failures: see ``stale``)."""
        return [r for r in self.rollouts if isinstance(r, FailedRollout) and not is_stale(r.error)]

    @property
    def stale(self) -> list[FailedRollout]:
        """The rollouts discarded or cancelled as too many policy versions behind (their error
        is a ``StaleRollout``): no sample, and no failure of any server."""
        return [r for r in self.rollouts if isinstance(r, FailedRollout) and is_stale(r.error)]

    @property
    def rewards(self) -> list[float]:
        """Rewards of the scored rollouts (failed and masked ones have none: they are not
        zeros)."""
        return [r.reward for r in self.scored]

    @property
    def complete(self) -> bool:
        """Every rollout of the group was scored (none failed, none masked)."""
        return len(self.scored) == len(self.rollouts)
