"""The recorder: every finished rollout goes through here, whoever ran it.

It checks the record (a ``mask_sample`` that is no boolean makes it a failure: ``records.checked``),
gives it its integrity verdict (``records.tagged``: masked when ``mask_exploits`` and an exploit), writes it to its sink (the run's ledger files, or memory for the trainer API), advances the
progress bar (counting failed and masked rollouts), feeds the failure budget, and aborts the run
when the budget says the servers are broken. ``admit`` (the streaming API's staleness judge) may
turn a record into the outcome it is before anything else sees it. A dispatcher (local asyncio workers, Ray worker actors) only runs
rollouts and hands their records over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from rollgym.collect.failure_budget import FailureBudget
from rollgym.collect.progress import RunProgress
from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout, checked, tagged
from rollgym.errors import RollgymError

log = logging.getLogger("rollgym.collect")


class Sink(Protocol):
    """Where records go. ``add`` returns False for a rollout that already has a record (a late
    duplicate from a worker that was thought dead): it is dropped, never written twice."""

    def add(self, record: RolloutRecord) -> bool: ...


class MemorySink:
    """Records kept in memory, one per rollout (the trainer API's sink)."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], RolloutRecord] = {}
        self.first_failure: FailedRollout | None = None

    def add(self, record: RolloutRecord) -> bool:
        key = (record.task_index, record.rollout_index)
        if key in self.records:
            return False
        self.records[key] = record
        if self.first_failure is None and isinstance(record, FailedRollout):
            self.first_failure = record
        return True


class Recorder:
    """Consumes records: sink, progress, failure budget, abort."""

    def __init__(
        self,
        sink: Sink,
        budget: FailureBudget | None = None,
        progress: RunProgress | None = None,
        *,
        admit: Callable[[RolloutRecord], RolloutRecord] | None = None,
        mask_exploits: bool = False,
    ) -> None:
        self.sink = sink
        self.mask_exploits = mask_exploits
        self.admit = admit
        self.budget = budget
        self.progress = progress
        self.recorded = 0
        self.listeners: list[Callable[[RolloutRecord], None]] = []
        """Told of every record taken (``collect.live.RunWatch``: metrics, live progress)."""
        self.abort_reason: str | None = None
        self._on_abort: list[Callable[[], None]] = []
        self.resumed = asyncio.Event()
        """Set unless the launcher is repairing a server: dispatchers wait on it before they
        send the next rollout (rollouts sent to a dead server would only fail)."""
        self.resumed.set()

    def pause(self, paused: bool) -> None:
        """Hold new rollouts (True) while a server is being restarted; send them again
        (False)."""
        if paused:
            self.resumed.clear()
        else:
            self.resumed.set()

    def on_abort(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the run aborts (a dispatcher cancels its work)."""
        self._on_abort.append(callback)

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def record(self, record: RolloutRecord) -> None:
        record = tagged(checked(record), self.mask_exploits)
        if self.admit is not None:
            record = self.admit(record)
        if not self.sink.add(record):
            return
        self.recorded += 1
        for listener in self.listeners:
            listener(record)
        error = record.error if isinstance(record, FailedRollout) else None
        if self.progress is not None:
            masked = isinstance(record, ScoredRollout) and record.masked
            self.progress.advance(failed=error is not None, masked=masked)
        if self.budget is not None:
            reason = self.budget.observe(error)
            if reason is not None:
                self.abort(reason)

    def held(self, err: RollgymError) -> None:
        """A rollout was refused by an open circuit and is being held (not recorded): the
        budget decides whether the servers have been down for too long."""
        if self.budget is not None:
            reason = self.budget.observe_hold(err)
            if reason is not None:
                self.abort(reason)

    def crashed(self, where: str, exc: Exception) -> None:
        """The dispatch itself broke (the ledger cannot be written, the task file went bad): no
        rollout can be recorded any more, so stop the run and say why, instead of losing a
        worker silently."""
        log.error("%s crashed", where, exc_info=exc)
        self.abort(f"collector error: {type(exc).__name__}: {exc}")

    def abort(self, reason: str) -> None:
        """Stop the run: dispatchers cancel what is in flight (it stays unrecorded, so a
        ``--resume`` runs it). The first reason wins."""
        if self.abort_reason is not None:
            return
        self.abort_reason = reason
        log.error("aborting run: %s", reason)
        for callback in self._on_abort:
            callback()
