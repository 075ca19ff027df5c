"""``GroupFeed`` without servers: work handed out under back-pressure, groups assembled from
records in any order, late duplicates dropped, re-runs under fresh indices and bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from rollgym.collect.records import FailedRollout, RolloutItem, ScoredRollout
from rollgym.errors import HTTPStatusError, RollgymError, StaleRollout
from rollgym.trainer.feed import GroupFeed, OnFailure, OpenGroup, StreamStats
from rollgym.trainer.staleness import StalenessJudge
from rollgym.trainer.stream_ledger import StreamLedger


class Host:
    """The least a stream is to its feed."""

    def __init__(self, repeats: int, max_ahead: int, on_failure: OnFailure = "partial") -> None:
        self.stats = StreamStats()
        self.ledger: StreamLedger | None = None
        self.judge: StalenessJudge | None = None
        self.repeats = repeats
        self.max_ahead = max_ahead
        self.on_failure: OnFailure = on_failure
        self.max_reruns = 1
        self.rerun_stale = True
        self.max_stale_reruns = 1
        self.arrived = asyncio.Event()
        self.failed: list[str] = []
        self.left: list[OpenGroup] = []

    @property
    def in_flight(self) -> int:
        return self.stats.dispatched - self.stats.recorded

    def accepting(self) -> bool:
        return not self.failed

    def item(self, row: dict[str, Any], task_index: int, rollout_index: int) -> RolloutItem:
        stamped = orjson.dumps({**row, "task_index": task_index, "rollout_index": rollout_index})
        return RolloutItem(task_index, rollout_index, stamped, "agent")

    def fail(self, reason: str, error: RollgymError | None = None) -> None:
        self.failed.append(reason)

    def written(self, group: OpenGroup) -> None:
        self.left.append(group)


def scored(item: RolloutItem) -> ScoredRollout:
    return ScoredRollout(item.task_index, item.rollout_index, 1.0, 1, 0.1, {"reward": 1.0})


def failed(item: RolloutItem, err: RollgymError | None = None) -> FailedRollout:
    err = err or HTTPStatusError("boom", status=500, server="model")
    return FailedRollout(item.task_index, item.rollout_index, err, 1, 0.1)


async def test_back_pressure_and_completion_order_and_duplicates() -> None:
    host = Host(repeats=2, max_ahead=2)
    feed = GroupFeed(host, [{"i": i} for i in range(5)])
    items = await feed.take(10)  # two rows at most (max_ahead): their four rollouts
    assert [(i.task_index, i.rollout_index) for i in items] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    waiting = asyncio.ensure_future(feed.take(10))
    await asyncio.sleep(0)
    assert not waiting.done()  # back-pressure: no third row while two are ahead
    by_key = {(i.task_index, i.rollout_index): i for i in items}
    for key in [(1, 0), (1, 1), (0, 0)]:
        assert feed.add(scored(by_key[key]))
    assert not feed.add(scored(by_key[(1, 0)]))  # a late duplicate: dropped
    assert [g.task_index for g in feed.ready] == [1]  # task 1 finished first
    assert not waiting.done()  # still two groups ahead (one open, one waiting)
    feed.ready.popleft()
    feed.wake()
    assert [(i.task_index, i.rollout_index) for i in await waiting] == [(2, 0), (2, 1)]
    assert host.stats.scored == 3 and host.stats.dispatched == 6


async def test_reruns_take_fresh_indices_and_are_bounded() -> None:
    host = Host(repeats=2, max_ahead=4, on_failure="rerun")
    feed = GroupFeed(host, [{"i": 0}])
    first, second = await feed.take(10)
    assert feed.add(failed(first))
    (rerun,) = await feed.take(10)  # the re-run goes first, under a fresh index
    assert (rerun.task_index, rerun.rollout_index) == (0, 2)
    assert feed.add(failed(rerun))  # its repeat has had its one re-run: this failure stays
    stale = StaleRollout("too old", server="collector")
    assert feed.add(failed(second, stale))
    (again,) = await feed.take(10)  # a stale outcome has its own bound
    assert again.rollout_index == 3
    assert feed.add(scored(again))
    group = feed.ready[0].build()
    assert [r.rollout_index for r in group.rollouts] == [2, 3]
    assert [r.rollout_index for r in group.replaced] == [0, 1]
    assert len(group.failed) == 1 and group.stale == [] and len(group.scored) == 1
    assert host.stats.reruns == 2 and host.stats.failed == 2 and host.stats.stale == 1
    feed.ready.popleft()
    assert await feed.take(10) == []  # the source is done and nothing is open: the end


async def test_a_row_that_is_no_object_stops_the_feed() -> None:
    host = Host(repeats=1, max_ahead=4)
    rows: list[Any] = [{"i": 0}, ["not", "a", "row"]]
    feed = GroupFeed(host, rows)
    items = await feed.take(10)
    assert [i.task_index for i in items] == [0]
    assert host.failed and "row 1" in host.failed[0] and "list" in host.failed[0]
