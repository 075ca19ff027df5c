"""The local dispatcher's ramp: workers start in waves of ``RAMP_STEP``, each wave when it is
due, and a dispatch cancelled or aborted mid-ramp leaves no worker running and starts none."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from rollgym.collect.dispatch import RAMP_INTERVAL, RAMP_STEP, LocalDispatcher
from rollgym.collect.recorder import MemorySink, Recorder
from rollgym.collect.records import RolloutItem, RolloutRecord, ScoredRollout
from rollgym.collect.rollout import RolloutPolicy
from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


class Gate:
    """A runner whose rollouts wait for ``open``; counts those started and cancelled."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.started = 0
        self.cancelled = 0
        self.on_hold: Callable[[RollgymError], None] | None = None
        self.circuit_holds = 0
        self.failovers = 0

    async def run(self, item: RolloutItem) -> RolloutRecord:
        self.started += 1
        try:
            await self.open.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return ScoredRollout(item.task_index, item.rollout_index, 1.0, 1, 0.0, {"reward": 1.0})


def items(n: int) -> Iterator[RolloutItem]:
    return (RolloutItem(i, 0, b"{}", "agent") for i in range(n))


async def started_dispatch(
    n: int, concurrency: int
) -> tuple[Gate, Recorder, asyncio.Task[None], LocalDispatcher]:
    gate = Gate()
    dispatcher = LocalDispatcher(RolloutPolicy(), concurrency, runner=lambda *_: gate)
    async with HttpClient() as http:
        await dispatcher.start(http, {"agent": Target.single("agent", "http://127.0.0.1:9")})
    recorder = Recorder(MemorySink())
    task = asyncio.create_task(dispatcher.dispatch(items(n), n, recorder))
    for _ in range(5):
        await asyncio.sleep(0)
    return gate, recorder, task, dispatcher


async def test_workers_start_in_waves_up_to_the_concurrency() -> None:
    concurrency = 2 * RAMP_STEP + 88
    gate, recorder, task, dispatcher = await started_dispatch(5000, concurrency)
    # The first wave only: the next is not due yet, and is not even made until it is.
    assert gate.started == RAMP_STEP and len(dispatcher._workers) == RAMP_STEP
    # Every wave, however late a busy machine runs them, and never more than the concurrency.
    await wait_until(lambda: gate.started >= concurrency, 30, "every wave started")
    assert gate.started == concurrency
    gate.open.set()
    await task
    sink = recorder.sink
    assert isinstance(sink, MemorySink) and len(sink.records) == 5000


async def test_a_dispatch_cancelled_mid_ramp_leaves_no_worker_behind() -> None:
    gate, _, task, dispatcher = await started_dispatch(5000, 8 * RAMP_STEP)
    assert gate.started == RAMP_STEP
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(w.done() for w in dispatcher._workers)  # ended with it, not after
    await asyncio.sleep(3 * RAMP_INTERVAL)
    assert gate.started == RAMP_STEP and gate.cancelled == RAMP_STEP


async def test_an_abort_mid_ramp_starts_no_further_wave() -> None:
    gate, recorder, task, dispatcher = await started_dispatch(5000, 8 * RAMP_STEP)
    recorder.on_abort(dispatcher.cancel)
    recorder.abort("the servers are broken")
    await asyncio.wait_for(task, 5)
    assert gate.started == RAMP_STEP and gate.cancelled == RAMP_STEP
