"""Bounded staleness: a rollout whose oldest model call ran more than ``max_staleness`` policy
versions behind the live weights is no sample for the trainer.

It ends as a ``FailedRollout`` whose error is ``StaleRollout`` (root type ``stale_rollout``),
one of two ways:
- cancelled in flight: a model server with ``max_staleness`` set refuses the rollout's next
  call (409 ``stale_rollout``, read from the ``x-rollgym-oldest-version`` header the agent
  sends); the agent's error carries it as its root;
- discarded: ``StalenessJudge`` reads the versions of the record's model calls and turns a
  scored rollout that is too old into that failure: on arrival (the recorder's ``admit``
  hook), and again when its group leaves for the trainer (``rollgym.trainer.stream``: the live
  version may have moved on while the group waited in the buffer).

Either way it is an outcome, not a failure: ``FailureBudget`` never counts it
(``failure_budget.is_stale``), and ``TaskGroup.stale`` lists it apart from ``failed``.

A rollout is as old as its oldest model call whose version is known (a call that says it ran
under a version the trainer never made live is counted in ``ahead`` and warned about once); a scored rollout whose
calls carry no version (a model server that does not know its weights'
version) cannot be judged: it is kept, counted in ``unversioned`` and warned about once, never
guessed stale or fresh in silence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout, spent_by
from rollgym.errors import StaleRollout

log = logging.getLogger("rollgym.collect")


def record_versions(record: ScoredRollout) -> tuple[int, ...]:
    """The known policy versions of ``record``'s model calls, in call order (empty if none
    says): ``ScoredRollout.policy_versions`` without its unknowns."""
    return tuple(v for v in record.policy_versions if v is not None)


class StalenessJudge:
    """Discards on arrival the scored rollouts more than ``max_staleness`` versions behind
    ``live()`` (see the module docstring); every other record passes unchanged."""

    def __init__(self, max_staleness: int, live: Callable[[], int]) -> None:
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self.live = live
        self.discarded = 0
        self.unversioned = 0
        self.ahead = 0

    def __call__(self, record: RolloutRecord) -> RolloutRecord:
        if not isinstance(record, ScoredRollout):
            return record
        versions = record_versions(record)
        if not versions:
            if self.unversioned == 0:
                log.warning(
                    "rollout %d:%d has no policy version on its model calls: its staleness "
                    "cannot be judged (is the model server a rollgym model server?)",
                    record.task_index, record.rollout_index,
                )  # fmt: skip
            self.unversioned += 1
            return record
        live, oldest = self.live(), min(versions)
        if max(versions) > live:
            # A model server runs weights the trainer never made live (swapped without a
            # resume?): the rollout is judged by its oldest call all the same, and said so.
            if self.ahead == 0:
                log.warning(
                    "rollout %d:%d ran under policy version %d, ahead of the live version %d: "
                    "were weights swapped without resume()?",
                    record.task_index, record.rollout_index, max(versions), live,
                )  # fmt: skip
            self.ahead += 1
        if live - oldest <= self.max_staleness:
            return record
        self.discarded += 1
        detail = {
            "versions": list(versions),
            "live_version": live,
            "max_staleness": self.max_staleness,
        }
        err = StaleRollout(
            f"discarded: its oldest model call ran under version {oldest}, "
            f"{live - oldest} behind the live version {live} (max_staleness {self.max_staleness})",
            server="collector", body=orjson.dumps(detail), retryable=False,
        )  # fmt: skip
        return FailedRollout(
            record.task_index, record.rollout_index, err, record.attempts, record.duration_s,
            cost=spent_by(record),  # it ran in full: its tokens were spent, and are waste
        )  # fmt: skip
