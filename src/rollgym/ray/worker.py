"""``CollectWorker``: the Ray actor that runs a share of a run's rollouts.

The driver hands each worker chunks of pending rollouts; the worker runs them against the
agent's replicas (least outstanding requests) with at most ``concurrency`` in flight and streams
the finished records back in small batches, as they finish. It writes nothing: the driver owns
the one ledger, so a record is written once however work moves between workers.

A replica that refuses connections (its process is gone) is taken out of rotation for this
worker at once, and the rollout goes to another replica: a refused connection sent nothing, so
this is safe for any endpoint. The driver also passes the replicas it knows are dead.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import ray

from rollgym.errors import ConnectError, InternalError
from rollgym.http import HttpClient, Target
from rollgym.trainer import FailedRollout, RolloutRecord, run_rollout

WorkItem = tuple[str, int, int, bytes, int]
"""(agent name, task index, rollout index, the stamped task row, attempts made before)."""

BATCH_LINGER = 0.02
"""Seconds a finished record waits for others to share its trip to the driver."""

SUSPECT_SECONDS = 10.0
"""How long a replica that refused a connection stays out of rotation before it is tried again
(the driver's monitor marks a replica whose process ended dead for good)."""


class CollectWorker:
    """Runs rollouts for the driver; ``targets`` are the run's agents (all replica URLs)."""

    def __init__(
        self,
        targets: dict[str, Target],
        *,
        concurrency: int,
        rollout_timeout: float,
        max_attempts: int,
    ) -> None:
        # One Target per agent, with every replica: replicas are taken out through the client's
        # balancer, so its breaker, budget and load counts survive a replica's loss.
        self._all = targets
        self._dead: set[str] = set()
        self._gate = asyncio.Semaphore(concurrency)
        self._timeout = rollout_timeout
        self._max_attempts = max_attempts
        self._http: HttpClient | None = None
        self._tasks: set[asyncio.Task[RolloutRecord]] = set()
        self._aborted = False
        self.finished = 0
        self.failovers = 0

    async def ready(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid()}

    @property
    def http(self) -> HttpClient:
        if self._http is None:
            self._http = HttpClient()
        return self._http

    async def run(
        self, items: list[WorkItem], down: list[str]
    ) -> AsyncIterator[list[RolloutRecord]]:
        """Run ``items``; yield their records in batches as they finish. A rollout cancelled by
        ``cancel`` yields no record (it stays pending in the ledger)."""
        self._take_down(down)
        finished: asyncio.Queue[asyncio.Task[RolloutRecord]] = asyncio.Queue()
        tasks = []
        for item in items:
            task = asyncio.create_task(self._one(item))
            task.add_done_callback(finished.put_nowait)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            tasks.append(task)
        try:
            remaining = len(tasks)
            while remaining:
                done = [await finished.get()]
                if remaining > 1:
                    # Let a batch gather: every yield is an object in Ray's store, and one per
                    # record costs the driver more than the record itself.
                    await asyncio.sleep(BATCH_LINGER)
                while not finished.empty():
                    done.append(finished.get_nowait())
                remaining -= len(done)
                records = [t.result() for t in done if not t.cancelled()]
                self.finished += len(records)
                if records:
                    yield records
        finally:
            # The driver stopped reading (abort, or it died): do not leave work running.
            for task in tasks:
                task.cancel()

    async def _one(self, item: WorkItem) -> RolloutRecord:
        name, task_index, rollout_index, raw, prior = item
        started = time.monotonic()
        async with self._gate:
            if self._aborted:
                raise asyncio.CancelledError
            try:
                failovers = len(self._all[name].urls) - 1  # each replica refuses at most once
                while True:
                    record = await run_rollout(
                        self.http, self._target(name), raw, task_index, rollout_index,
                        timeout=self._timeout, max_attempts=self._max_attempts,
                        prior_attempts=prior, may_retry=lambda: not self._aborted,
                    )  # fmt: skip
                    if (
                        failovers > 0
                        and isinstance(record, FailedRollout)
                        and isinstance(record.error, ConnectError)
                        and self._take_out(name, record.error.url)
                    ):
                        failovers -= 1
                        self.failovers += 1
                        continue
                    return record
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must still end as this rollout's record
                err = InternalError(f"collect worker: {type(exc).__name__}: {exc}")
                return FailedRollout(
                    task_index, rollout_index, err, prior + 1, time.monotonic() - started
                )

    def _target(self, name: str) -> Target:
        return self._all[name]

    def _take_out(self, name: str, url: str | None) -> bool:
        """Take the replica that ``url`` was sent to out of rotation for a while; True if
        another replica is left to try."""
        target = self._all[name]
        base = _base_of(url, target.urls)
        if base is None:
            return False
        self.http.mark_down(target, base, SUSPECT_SECONDS)
        return bool(self.http.live_urls(target))

    def _take_down(self, urls: list[str]) -> None:
        new = set(urls) - self._dead
        self._dead.update(new)
        for target in self._all.values():
            for url in new & set(target.urls):
                self.http.mark_down(target, url)

    async def mark_down(self, urls: list[str]) -> None:
        """The driver found these replicas dead: never send them anything again."""
        self._take_down(urls)

    async def cancel(self) -> None:
        """Abort: cancel every rollout in flight or queued (they stay pending)."""
        self._aborted = True
        for task in list(self._tasks):
            task.cancel()

    async def stats(self) -> dict[str, Any]:
        http = {} if self._http is None else {k: vars(v) for k, v in self._http.stats().items()}
        return {"rollouts": self.finished, "failovers": self.failovers, "http": http}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def _base_of(url: str | None, bases: tuple[str, ...]) -> str | None:
    if not url:
        return None
    for base in bases:
        if url == base or url.startswith(base + "/"):
            return base
    return None


CollectWorkerActor = ray.remote(max_restarts=2, max_task_retries=0)(CollectWorker)
