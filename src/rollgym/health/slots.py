"""The rollouts ``tasks.jsonl`` asks for, as slots: a byte per rollout, not an object.

``tasks.jsonl`` is read twice: once for its shape (rows, the largest indices), once to mark
each row's slot. A run's indices are dense (``task_index`` 0..T-1, ``rollout_index``
0..R-1), so a slot is ``task * R + rollout`` in a bytearray: a million-row run costs a
megabyte. A hand-made file with sparse indices (a task 10**12) falls back to a dict rather
than allocate for the gap.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator

from rollgym.collect.layout import LedgerLine

_SPARSE_SLACK = 4096
"""Empty slots a dense table may hold beyond 4 per row before sparse indices get a dict."""

SATURATED = 255
"""A count of records in one slot stops here (it only has to tell 0, 1 and more)."""


class Slots:
    """Per (task_index, rollout_index): whether ``tasks.jsonl`` has it, how many records."""

    def __init__(self, rows: int, max_task: int, max_rollout: int) -> None:
        self.repeats = max_rollout + 1
        self.tasks = max_task + 1
        size = self.tasks * self.repeats
        self._dense = size <= 4 * rows + _SPARSE_SLACK
        self._expected = bytearray(size if self._dense else 0)
        self._counts = bytearray(size if self._dense else 0)
        self._sparse_expected: set[tuple[int, int]] = set()
        self._sparse_counts: dict[tuple[int, int], int] = {}
        # Per task: records, failures and unhealthy records (failures included), for the
        # checks of tasks that never succeed; 24 bytes a task when dense.
        width = self.tasks if self._dense else 0
        self._task_records = array("l", bytes(8 * width))
        self._task_failures = array("l", bytes(8 * width))
        self._task_unhealthy = array("l", bytes(8 * width))
        self._sparse_tasks: Counter[tuple[int, int]] = Counter()

    @property
    def dense(self) -> bool:
        """Indices dense enough for flat tables (``tasks`` entries), else dicts."""
        return self._dense

    @classmethod
    def shaped(cls, lines: Iterator[LedgerLine]) -> Slots:
        """Empty slots sized for the rows of ``lines`` (the first pass over tasks.jsonl)."""
        rows = max_task = max_rollout = 0
        for line in lines:
            rows += 1
            task, rollout = line.key
            max_task, max_rollout = max(max_task, task), max(max_rollout, rollout)
        return cls(rows, max_task if rows else -1, max_rollout if rows else 0)

    def _slot(self, key: tuple[int, int]) -> int | None:
        task, rollout = key
        if task >= self.tasks or rollout >= self.repeats:
            return None
        return task * self.repeats + rollout

    def expect(self, key: tuple[int, int]) -> bool:
        """Mark ``key`` as a row of tasks.jsonl; False if it already was (a duplicate row)."""
        if not self._dense:
            if key in self._sparse_expected:
                return False
            self._sparse_expected.add(key)
            return True
        slot = self._slot(key)
        if slot is None or self._expected[slot]:
            return slot is None  # beyond the shape: cannot happen for the rows that shaped it
        self._expected[slot] = 1
        return True

    def expected(self, key: tuple[int, int]) -> bool:
        if not self._dense:
            return key in self._sparse_expected
        slot = self._slot(key)
        return slot is not None and bool(self._expected[slot])

    def record(self, key: tuple[int, int]) -> int:
        """Count a record of ``key`` (one of tasks.jsonl's); the count so far, this one in."""
        if not self._dense:
            count = self._sparse_counts.get(key, 0) + 1
            self._sparse_counts[key] = count
            return count
        slot = self._slot(key)
        assert slot is not None  # callers count expected keys only
        count = min(SATURATED, self._counts[slot] + 1)
        self._counts[slot] = count
        return count

    def missing(self) -> Iterator[tuple[int, int]]:
        """The rows of tasks.jsonl with no record, in index order."""
        if not self._dense:
            for key in sorted(self._sparse_expected):
                if key not in self._sparse_counts:
                    yield key
            return
        for slot, (want, got) in enumerate(zip(self._expected, self._counts, strict=True)):
            if want and not got:
                yield divmod(slot, self.repeats)

    def count_task(self, task: int, failed: bool, unhealthy: bool) -> None:
        """Count a record of ``task`` (one of tasks.jsonl's): a failure or not, unhealthy (a
        failure, or a rollout with a finding) or not."""
        if not self._dense:
            self._sparse_tasks[(task, 0)] += 1
            self._sparse_tasks[(task, 1)] += failed
            self._sparse_tasks[(task, 2)] += unhealthy
            return
        self._task_records[task] += 1
        self._task_failures[task] += failed
        self._task_unhealthy[task] += unhealthy

    def task_totals(self) -> Iterator[tuple[int, int, int, int]]:
        """(task, records, failures, unhealthy) of every task with a record, in index order."""
        if not self._dense:
            for task in sorted({t for t, _ in self._sparse_tasks}):
                got = self._sparse_tasks[(task, 0)]
                if got:
                    yield task, got, self._sparse_tasks[(task, 1)], self._sparse_tasks[(task, 2)]
            return
        columns = (self._task_records, self._task_failures, self._task_unhealthy)
        for task, (got, failed, unhealthy) in enumerate(zip(*columns, strict=True)):
            if got:
                yield task, got, failed, unhealthy
