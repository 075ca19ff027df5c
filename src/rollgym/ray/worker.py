"""``CollectWorker``: the Ray actor that runs a share of a run's rollouts.

The driver hands each worker chunks of pending rollouts; the worker runs them against the
agent's replicas (least outstanding requests) with at most ``concurrency`` in flight and streams
the finished records back in small batches, as they finish. It writes nothing: the driver owns
the one ledger, so a record is written once however work moves between workers.

A replica that refuses connections (its process is gone) is taken out of rotation for this
worker at once, and the rollout goes to another replica: a refused connection sent nothing, so
this is safe for any endpoint. The driver also passes the replicas it knows are dead.

With ``metrics_host`` a worker serves Prometheus metrics (``rollgym.ray.metrics``) on a
port of its own, started by ``ready`` and reported there (``metrics_url``): a run with
``--metrics-port`` lists every worker in its scrape targets. A loopback ``metrics_host`` binds
loopback (scraped from the worker's own node); any other binds the node's address.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from rollgym import tracing
from rollgym.collect.dialect import Dialects
from rollgym.collect.records import RolloutItem, RolloutRecord
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.dialects import ROW_DIALECTS
from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target
from rollgym.launch.ports import bind_socket, is_loopback, socket_url

if TYPE_CHECKING:
    from rollgym.prometheus.exporter import MetricsServer

BATCH_LINGER = 0.02
"""Seconds a finished record waits for others to share its trip to the driver."""
HOLD_REPORT_S = 1.0
"""While nothing finishes, how often rollouts held by an open circuit are reported (the
driver's failure budget aborts a run whose circuits stay open)."""


@dataclass(frozen=True, slots=True)
class WorkerBatch:
    """What a worker sends the driver: finished records, and the last rollout refused by an open
    circuit since the previous batch (None if none was)."""

    records: list[RolloutRecord]
    held: RollgymError | None = None


class CollectWorker:
    """Runs rollouts for the driver; ``targets`` are the run's agents (all replica URLs)."""

    def __init__(
        self,
        targets: dict[str, Target],
        *,
        concurrency: int,
        policy: RolloutPolicy,
        index: int = 0,
        metrics_host: str | None = None,
    ) -> None:
        # One Target per agent, with every replica: replicas are taken out through the client's
        # balancer, so its breaker, budget and load counts survive a replica's loss.
        self._all = targets
        self._dead: set[str] = set()
        self._gate = asyncio.Semaphore(concurrency)
        self._policy = policy
        self._runner: RolloutRunner | None = None
        self._tasks: set[asyncio.Task[RolloutRecord]] = set()
        self._aborted = False
        self._held: RollgymError | None = None
        self.finished = 0
        self.running = 0
        self.started = 0
        """Rollouts this worker began to run (sent to their agent) in its life: at a budget's
        cancel, the driver subtracts the records it took from it (``RayDispatcher``)."""
        self.index = index
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self._metrics_host = metrics_host
        self._metrics: MetricsServer | None = None
        self._metrics_lock = asyncio.Lock()
        tracing.setup("rollgym-collect-worker")  # if OTEL_TRACES_EXPORTER asks (rollgym.tracing)

    async def ready(self) -> dict[str, Any]:
        """Where this worker runs (and its metrics URL, starting its metrics server once)."""
        where: dict[str, Any] = {"node_id": self.node_id, "pid": self.pid}
        if self._metrics_host is not None:
            # The driver may ask again before an answer came (its wait timed out): one server.
            async with self._metrics_lock:
                if self._metrics is None:
                    self._metrics = await self._serve_metrics(self._metrics_host)
            where["metrics_url"] = self._metrics.url
        return where

    async def _serve_metrics(self, host: str) -> MetricsServer:
        from rollgym.prometheus.exporter import MetricsServer
        from rollgym.prometheus.exposition import Exposition

        def families() -> Iterator[Any]:
            from rollgym.ray.metrics import worker_families

            return worker_families(self)

        if not is_loopback(host):
            host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        sock = bind_socket(host, 0)
        exposition = Exposition(families, ("rollgym.http.metrics", "rollgym.ray.metrics"))
        return await MetricsServer(exposition, sock, socket_url(sock)).start()

    @property
    def queued(self) -> int:
        """Rollouts handed over and waiting for a slot."""
        return max(0, len(self._tasks) - self.running)

    @property
    def runner_if_started(self) -> RolloutRunner | None:
        return self._runner

    @property
    def runner(self) -> RolloutRunner:
        if self._runner is None:
            self._runner = RolloutRunner(
                HttpClient(), self._all, self._policy, stopping=lambda: self._aborted,
                on_hold=self._on_hold, dialects=Dialects(ROW_DIALECTS),
            )  # fmt: skip
        return self._runner

    def _on_hold(self, err: RollgymError) -> None:
        self._held = err

    def _take_held(self) -> RollgymError | None:
        held, self._held = self._held, None
        return held

    async def run(self, items: list[RolloutItem], down: list[str]) -> AsyncIterator[WorkerBatch]:
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
                try:
                    done = [await asyncio.wait_for(finished.get(), HOLD_REPORT_S)]
                except TimeoutError:
                    if self._held is not None:
                        yield WorkerBatch([], self._take_held())
                    continue
                if remaining > 1:
                    # Let a batch gather: every yield is an object in Ray's store, and one per
                    # record costs the driver more than the record itself.
                    await asyncio.sleep(BATCH_LINGER)
                while not finished.empty():
                    done.append(finished.get_nowait())
                remaining -= len(done)
                records = [t.result() for t in done if not t.cancelled()]
                self.finished += len(records)
                held = self._take_held()
                if records or held is not None:
                    yield WorkerBatch(records, held)
        finally:
            # The driver stopped reading (abort, or it died): do not leave work running.
            for task in tasks:
                task.cancel()

    async def _one(self, item: RolloutItem) -> RolloutRecord:
        async with self._gate:
            if self._aborted:
                raise asyncio.CancelledError  # never started: nothing was spent on it
            self.started += 1
            self.running += 1
            try:
                return await self.runner.run(item)
            finally:
                self.running -= 1

    def _take_down(self, urls: list[str]) -> None:
        new = set(urls) - self._dead
        self._dead.update(new)
        for target in self._all.values():
            for url in new & set(target.urls):
                self.runner.http.mark_down(target, url)

    async def mark_down(self, urls: list[str]) -> None:
        """The driver found these replicas dead: never send them anything again."""
        self._take_down(urls)

    async def cancel(self) -> int:
        """Abort: cancel every rollout in flight or queued (they stay pending). How many
        rollouts it had started in all (``started``: none starts after this)."""
        self._aborted = True
        for task in list(self._tasks):
            task.cancel()
        return self.started

    async def stats(self) -> dict[str, Any]:
        runner = self._runner
        if runner is None:
            return {"rollouts": self.finished, "circuit_holds": 0, "failovers": 0, "http": {}}
        return {
            "rollouts": self.finished,
            "circuit_holds": runner.circuit_holds,
            "failovers": runner.failovers,
            "http": {k: vars(v) for k, v in runner.http.stats().items()},
        }

    async def close(self) -> None:
        if self._metrics is not None:
            await self._metrics.close()
        if self._runner is not None:
            await self._runner.http.close()


CollectWorkerActor = ray.remote(max_restarts=2, max_task_retries=0)(CollectWorker)
