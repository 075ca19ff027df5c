"""The stream's feed: rows in, rollouts out to the dispatcher, records back in, groups out.

``GroupFeed`` is both sides of a ``RolloutStream``'s dispatch: the ``Feed`` its dispatcher takes
work from (``rollgym.collect.dispatch``) and the ``Sink`` its recorder hands records to. It
starts rows (``repeats`` rollouts each) while back-pressure allows, assembles each row's group
from its records, re-runs failed or stale rollouts as the stream's rule says (fresh rollout
indices), and keeps the finished groups until the consumer takes them. Its host (the stream)
holds the options and the counters; see ``rollgym.trainer.stream`` for the behaviour as a whole.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rollgym.collect.failure_budget import is_stale
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord
from rollgym.errors import InputError, RollgymError
from rollgym.trainer.group import TaskGroup
from rollgym.trainer.staleness import StalenessJudge
from rollgym.trainer.stream_ledger import StreamLedger

OnFailure = Literal["drop", "partial", "rerun"]


@dataclass
class StreamStats:
    """What a stream did so far (counts of rollouts and groups)."""

    dispatched: int = 0
    scored: int = 0
    failed: int = 0
    stale: int = 0
    reruns: int = 0
    """Rollouts dispatched to replace a failed or stale one (included in ``dispatched``)."""
    groups_yielded: int = 0
    groups_dropped: int = 0
    peak_ready: int = 0
    """The most finished groups that waited for the consumer at once."""
    peak_open: int = 0
    """The most groups started and not yet finished at once."""
    peak_in_flight: int = 0
    """The most rollouts dispatched and not yet recorded at once."""
    unversioned: int = 0
    """Scored rollouts whose staleness could not be judged (no version on their calls)."""

    @property
    def recorded(self) -> int:
        return self.scored + self.failed + self.stale


@dataclass(slots=True)
class OpenGroup:
    """A group being collected: its records so far and what is still out."""

    task_index: int
    task: dict[str, Any]
    outstanding: set[int]
    next_index: int
    settled: dict[int, RolloutRecord] = field(default_factory=dict)
    replaced: list[RolloutRecord] = field(default_factory=list)
    slot: dict[int, int] = field(default_factory=dict)
    """A re-run's rollout index -> the repeat it stands for (absent: itself)."""
    reruns: Counter[int] = field(default_factory=Counter)
    stale_reruns: Counter[int] = field(default_factory=Counter)
    """Re-runs so far of each repeat, after failures and after stale outcomes."""

    def build(self) -> TaskGroup:
        rollouts = tuple(self.settled[i] for i in sorted(self.settled))
        return TaskGroup(self.task_index, self.task, rollouts, tuple(self.replaced))


class FeedHost(Protocol):
    """What the feed needs of its stream: options, counters, and a way to stop."""

    stats: StreamStats
    ledger: StreamLedger | None
    judge: StalenessJudge | None
    repeats: int
    max_ahead: int
    on_failure: OnFailure
    max_reruns: int
    rerun_stale: bool
    max_stale_reruns: int
    arrived: asyncio.Event

    @property
    def in_flight(self) -> int: ...

    def accepting(self) -> bool: ...

    def item(self, row: dict[str, Any], task_index: int, rollout_index: int) -> RolloutItem: ...

    def fail(self, reason: str, error: RollgymError | None = None) -> None: ...

    def written(self, group: OpenGroup) -> None: ...


class GroupFeed:
    """The stream's work (a ``Feed`` for the dispatcher) and its records' sink: it starts rows,
    assembles groups from records, schedules re-runs and holds finished groups for the
    consumer."""

    def __init__(self, stream: FeedHost, rows: Iterable[Any] | AsyncIterable[Any]) -> None:
        self.s = stream
        self._sync: Iterator[Any] | None = None
        self._async: AsyncIterator[Any] | None = None
        if isinstance(rows, AsyncIterable):
            self._async = aiter(rows)
        else:
            self._sync = iter(rows)
        self._fetch: asyncio.Task[Any] | None = None
        self._pending: deque[RolloutItem] = deque()
        self._requeued: deque[RolloutItem] = deque()
        self._open: dict[int, OpenGroup] = {}
        self.ready: deque[OpenGroup] = deque()
        self._next_task = 0
        self.exhausted = False
        self.stopped = False
        self._changed = asyncio.Event()
        self.source_error: BaseException | None = None

    # -- the Feed: work for the dispatcher ------------------------------------------------------

    async def take(self, n: int) -> list[RolloutItem]:
        """Up to ``n`` items, as many as there are without waiting (a Ray lane sends them as
        one chunk), waiting for the first; an empty list once the stream is over."""
        while True:
            # Cleared before looking, so that whatever changes from here on wakes the wait.
            self._changed.clear()
            if self.stopped:
                return []
            items = self._take_ready(n)
            if items:
                return items
            if self._may_start_row():
                self._start_fetch()
            if self.exhausted and not self._open and self._fetch is None and self._final():
                self.stop()
                return []
            await self._changed.wait()

    def _take_ready(self, n: int) -> list[RolloutItem]:
        """What can be handed out now: rollouts given back first, then re-runs and the
        repeats of rows already started, then new rows of a synchronous source (while
        back-pressure allows)."""
        items: list[RolloutItem] = []
        while self._requeued and len(items) < n:
            items.append(self._requeued.popleft())  # dispatched before: counted then
        stats = self.s.stats
        while len(items) < n:
            if not self._pending:
                if self._sync is None or not self._may_start_row():
                    break
                self._next_sync_row()
                continue
            item = self._pending.popleft()
            stats.dispatched += 1
            if self.s.ledger is not None:
                self.s.ledger.dispatched(item)
            items.append(item)
        stats.peak_in_flight = max(stats.peak_in_flight, self.s.in_flight)
        return items

    def _final(self) -> bool:
        """No finished group can open again: none waits to be judged as it leaves."""
        return self.s.judge is None or not self.ready

    def requeue(self, items: list[RolloutItem]) -> None:
        self._requeued.extend(items)
        self._changed.set()

    def may_grow(self) -> bool:
        """Whether back-pressure lets a new row start."""
        return len(self.ready) + len(self._open) < self.s.max_ahead

    def _may_start_row(self) -> bool:
        """Back-pressure: a new row only while fewer than ``max_ahead`` groups are started and
        not taken."""
        return not self.exhausted and self._fetch is None and self.may_grow() and self.s.accepting()

    def _next_sync_row(self) -> None:
        assert self._sync is not None
        try:
            row = next(self._sync)
        except StopIteration:
            self.exhausted = True
            return
        self._open_group(row)

    def _start_fetch(self) -> None:
        if self._async is None:
            return  # a synchronous source: read in ``_take_ready``
        self._fetch = asyncio.ensure_future(anext(self._async))
        self._fetch.add_done_callback(self._fetched)

    def _fetched(self, task: asyncio.Task[Any]) -> None:
        self._fetch = None
        self._changed.set()
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, StopAsyncIteration):
            self.exhausted = True
        elif exc is not None:
            self.exhausted = True
            self.source_error = exc
            self.s.fail(f"the row source raised {type(exc).__name__}: {exc}")
        else:
            self._open_group(task.result())

    def _open_group(self, row: Any) -> None:
        if not isinstance(row, dict):
            err = InputError(
                f"row {self._next_task} of the stream is a {type(row).__name__}, not a task "
                "row (a dict)"
            )
            self.exhausted = True
            self.s.fail(err.message, err)
            return
        t, repeats = self._next_task, self.s.repeats
        self._next_task += 1
        group = OpenGroup(t, dict(row), set(range(repeats)), repeats)
        self._open[t] = group
        self.s.stats.peak_open = max(self.s.stats.peak_open, len(self._open))
        self._pending.extend(self.s.item(group.task, t, r) for r in range(repeats))

    def stop(self) -> None:
        """No more work: every taker gets an empty list (the dispatch ends)."""
        self.stopped = True
        if self._fetch is not None:
            self._fetch.cancel()
        self._changed.set()
        self.s.arrived.set()

    def wake(self) -> None:
        self._changed.set()

    # -- the Sink: records from the recorder ----------------------------------------------------

    def add(self, record: RolloutRecord) -> bool:
        group = self._open.get(record.task_index)
        if group is None or record.rollout_index not in group.outstanding:
            return False  # a late duplicate (a worker thought dead): already recorded
        group.outstanding.discard(record.rollout_index)
        stats = self.s.stats
        if isinstance(record, FailedRollout):
            if is_stale(record.error):
                stats.stale += 1
            else:
                stats.failed += 1
        else:
            stats.scored += 1
        if self.s.judge is not None:
            stats.unversioned = self.s.judge.unversioned
        self._settle(group, record)
        if not group.outstanding:
            self._close(group)
        return True

    def _settle(self, group: OpenGroup, record: RolloutRecord) -> None:
        """``record`` counts for its group, or (the rule allows) is replaced by a re-run."""
        s = self.s
        slot = group.slot.get(record.rollout_index, record.rollout_index)
        if isinstance(record, FailedRollout):
            if is_stale(record.error):
                if s.rerun_stale and group.stale_reruns[slot] < s.max_stale_reruns:
                    group.stale_reruns[slot] += 1
                    self._rerun(group, record, slot)
                    return
            elif s.on_failure == "rerun" and group.reruns[slot] < s.max_reruns:
                group.reruns[slot] += 1
                self._rerun(group, record, slot)
                return
        group.settled[record.rollout_index] = record

    def _rerun(self, group: OpenGroup, replaced: RolloutRecord, slot: int) -> None:
        index = group.next_index
        group.next_index += 1
        group.slot[index] = slot
        group.outstanding.add(index)
        group.replaced.append(replaced)
        self.s.stats.reruns += 1
        # First in line: it finishes a group already started.
        self._pending.appendleft(self.s.item(group.task, group.task_index, index))
        self._changed.set()

    def _close(self, group: OpenGroup) -> None:
        del self._open[group.task_index]
        if self.s.on_failure == "drop" and not group.build().complete:
            self.s.stats.groups_dropped += 1
            self.s.written(group)
        else:
            self.ready.append(group)
            self.s.stats.peak_ready = max(self.s.stats.peak_ready, len(self.ready))
        self._changed.set()
        self.s.arrived.set()

    def rejudge(self, group: OpenGroup) -> bool:
        """Judge a finished group's rollouts again as it leaves for the consumer (the live
        version may have moved on while it waited): a rollout now too old becomes stale, its
        repeat re-run if the rule allows. True if the group is open again."""
        judge = self.s.judge
        if judge is None:
            return False
        now_stale = []
        for index, record in list(group.settled.items()):
            judged = judge(record)
            if judged is not record:
                del group.settled[index]
                now_stale.append(judged)
        if not now_stale:
            return False
        self.s.stats.scored -= len(now_stale)
        self.s.stats.stale += len(now_stale)
        self._open[group.task_index] = group
        for record in now_stale:
            self._settle(group, record)
        if not group.outstanding:
            self._close(group)  # nothing to re-run: it is finished again, stale rollouts in it
        return True
