"""``RayCollector``: the collector with dispatch spread over ``CollectWorker`` actors.

Everything but dispatch is the local collector's: the run directory, the ledger, resume, the
failure budget, metrics. The driver reads pending rollouts from ``tasks.jsonl`` and feeds each
worker chunks of them over a few lanes (so a worker always has the next chunk queued while it
finishes one); workers stream records back as they finish and the driver alone writes them. So
the output stays one ledger, every rollout recorded once:

- a worker whose process or node dies: the rollouts it had not reported go back in the queue
  and run on another worker (or on the same one once Ray has restarted it); a late copy of a
  record that was already written is dropped;
- an agent replica that dies: its in-flight rollouts come back as failures (``/run`` is not
  safe to replay), workers stop sending to it at the first refused connection, and the driver's
  monitor marks it dead for every worker;
- the driver dies: nothing was written for work in flight; ``--resume`` finishes the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import ray
from ray.exceptions import RayError

from rollgym.collect import Collector, PreparedRun, RunOutcome
from rollgym.errors import RollgymError
from rollgym.ray.placement import NodeInfo, alive_nodes, get, on_node, spread
from rollgym.ray.servers import RayServers
from rollgym.ray.worker import CollectWorkerActor, WorkItem
from rollgym.trainer import FailedRollout, RolloutRecord

log = logging.getLogger("rollgym.ray")

LANES = 2
"""Chunks in flight per worker: one running, one queued behind it."""
MONITOR_INTERVAL = 0.5


class _WorkQueue:
    """Pending rollouts: a stream from ``tasks.jsonl`` plus rollouts handed back by a worker
    that died. ``take`` waits while work is out that may still come back."""

    def __init__(self, source: Iterator[WorkItem]) -> None:
        self._source = source
        self._returned: deque[WorkItem] = deque()
        self._out = 0
        self._changed = asyncio.Event()
        self.requeued = 0

    async def take(self, n: int) -> list[WorkItem]:
        """Up to ``n`` items; an empty list once everything has been handed out for good."""
        while True:
            items: list[WorkItem] = []
            while self._returned and len(items) < n:
                items.append(self._returned.popleft())
            items.extend(_islice(self._source, n - len(items)))
            if items:
                self._out += len(items)
                return items
            if self._out == 0:
                return []
            self._changed.clear()
            await self._changed.wait()

    def finished(self, n: int) -> None:
        self._out -= n
        self._changed.set()

    def give_back(self, items: list[WorkItem]) -> None:
        self._returned.extend(items)
        self.requeued += len(items)
        self.finished(len(items))


def _islice(it: Iterator[WorkItem], n: int) -> list[WorkItem]:
    out: list[WorkItem] = []
    for item in it:
        out.append(item)
        if len(out) >= n:
            break
    return out


class RayCollector(Collector):
    """Collect one prepared run with ``workers`` actors (default: one per live node) against
    ``servers`` (started ``RayServers``, or name -> URLs of servers running anywhere)."""

    def __init__(
        self,
        run: PreparedRun,
        servers: RayServers | dict[str, list[str]],
        *,
        agent: str | None = None,
        progress: bool = True,
        workers: int | None = None,
        worker_cpus: float = 0.0,
    ) -> None:
        self.servers = servers if isinstance(servers, RayServers) else None
        urls = servers.urls if isinstance(servers, RayServers) else servers
        super().__init__(run, {k: list(v) for k, v in urls.items()}, agent=agent, progress=progress)
        self.n_workers = workers
        self.worker_cpus = worker_cpus
        self._actors: list[Any] = []
        self._worker_nodes: list[NodeInfo] = []
        self._down: set[str] = set()
        self._lost: list[dict[str, Any]] = []
        self._queue: _WorkQueue | None = None
        self._worker_stats: list[dict[str, Any]] = []

    # -- the run ------------------------------------------------------------------------------

    async def close(self) -> None:
        try:
            await self._stop_workers()
        finally:
            await super().close()

    async def dispatch(self) -> None:
        """Start the workers, feed them until every pending rollout has a record, watch the
        replicas meanwhile."""
        await self._start_workers()
        self._queue = _WorkQueue(self._items())
        lanes = [
            asyncio.create_task(self._lane(i, actor))
            for i, actor in enumerate(self._actors)
            for _ in range(LANES)
        ]
        self._workers = lanes  # so that ``abort`` cancels them
        monitor = asyncio.create_task(self._watch_replicas())
        try:
            await asyncio.gather(*lanes, return_exceptions=True)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
        if self.ledger.pending and self.abort_reason is None:
            self.abort_reason = "every collect worker died; finish the run with --resume"
            log.error("aborting run: %s", self.abort_reason)

    def _items(self) -> Iterator[WorkItem]:
        for task_index, rollout_index, raw in self._pending():
            prior = self.ledger.attempts_so_far(task_index, rollout_index)
            yield self._target_for(raw).name, task_index, rollout_index, raw, prior

    def abort(self, reason: str) -> None:
        super().abort(reason)
        for actor in self._actors:
            actor.cancel.remote()  # fire and forget: their rollouts stay pending

    # -- workers ------------------------------------------------------------------------------

    def _chunk(self) -> int:
        return max(1, math.ceil(self.cfg.concurrency / max(1, len(self._actors))))

    async def _start_workers(self) -> None:
        nodes = alive_nodes()
        n = self.n_workers or len(nodes)
        per_worker = max(1, math.ceil(self.cfg.concurrency / n))
        for _, node in spread(range(n), nodes):
            self._actors.append(
                CollectWorkerActor.options(
                    num_cpus=self.worker_cpus, scheduling_strategy=on_node(node, soft=True)
                ).remote(
                    self.targets,
                    concurrency=per_worker,
                    rollout_timeout=self.cfg.rollout_timeout,
                    max_attempts=self.cfg.max_rollout_attempts if self.cfg.retry_in_run else 0,
                )
            )
            self._worker_nodes.append(node)
        await get([a.ready.remote() for a in self._actors], 120)

    async def _lane(self, index: int, actor: Any) -> None:
        try:
            await self._feed(index, actor)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The driver itself broke (the ledger cannot be written, say): nothing can be
            # recorded any more, so stop the run and say why.
            log.exception("collect lane crashed")
            if self.abort_reason is None:
                self.abort(f"collector error: {type(exc).__name__}: {exc}")

    async def _feed(self, index: int, actor: Any) -> None:
        """Hand ``actor`` chunk after chunk and record what comes back, until no work is left
        (or the worker is dead for good)."""
        assert self._queue is not None
        queue = self._queue
        while self.abort_reason is None:
            items = await queue.take(self._chunk())
            if not items:
                return
            out = {(item[1], item[2]): item for item in items}  # not yet recorded
            try:
                async for ref in actor.run.remote(items, sorted(self._down)):
                    for record in await ref:
                        if out.pop((record.task_index, record.rollout_index), None) is not None:
                            self._record(record)
                            queue.finished(1)
            except RayError as exc:
                log.warning("collect worker %d failed (%s); %d rollouts go back in the queue",
                            index, type(exc).__name__, len(out))  # fmt: skip
                queue.give_back(list(out.values()))
                if not await self._alive(actor):
                    log.error("collect worker %d is gone for good", index)
                    return
                continue
            if out and self.abort_reason is None:
                queue.give_back(list(out.values()))  # not expected: run them elsewhere
            elif out:
                queue.finished(len(out))  # cancelled by the abort: they stay pending

    async def _alive(self, actor: Any) -> bool:
        """Wait for a worker that Ray is restarting; False if it stays dead."""
        try:
            await get(actor.ready.remote(), 60)
        except (RayError, TimeoutError):
            return False
        return True

    def _record(self, record: RolloutRecord) -> None:
        if self.ledger.is_done(record.task_index, record.rollout_index):
            return  # a late duplicate of a rollout that was handed to another worker
        err: RollgymError | None = None
        if isinstance(record, FailedRollout):
            err = record.error
            self.ledger.record_failure(record.to_ledger())
        else:
            self.ledger.record_success(record.to_ledger())
        self.completed_now += 1
        self.progress.advance(failed=err is not None)
        reason = self.budget.observe(err)
        if reason is not None and self.abort_reason is None:
            self.abort(reason)

    async def _stop_workers(self) -> None:
        actors, self._actors = self._actors, []
        for actor in actors:
            with contextlib.suppress(RayError, TimeoutError):
                await get(actor.close.remote(), 10)
            with contextlib.suppress(Exception):
                ray.kill(actor)

    # -- replicas -----------------------------------------------------------------------------

    async def _watch_replicas(self) -> None:
        if self.servers is None:
            return
        while True:
            await asyncio.sleep(MONITOR_INTERVAL)
            try:
                lost = await self.servers.poll()
            except Exception:
                log.exception("replica monitor failed")
                continue
            if not lost:
                continue
            for rep in lost:
                self._down.add(rep.url)
                self._lost.append(rep.describe())
                live = [u for u in self.urls.get(rep.name, []) if u != rep.url]
                if live:
                    self.urls[rep.name] = live  # for the final /aggregate_metrics call
            urls = [rep.url for rep in lost]
            for actor in self._actors:
                actor.mark_down.remote(urls)

    # -- metrics ------------------------------------------------------------------------------

    async def _finish(self, wall: float) -> RunOutcome:
        await self._collect_stats()
        self.run.run_info["ray"] = self._ray_info()
        outcome = await super()._finish(wall)
        # The HTTP counters of the run live in the workers: report theirs, with the driver's.
        metrics = dict(outcome.metrics)
        metrics["http"] = _merge_http([metrics.get("http", {})] + [
            s.get("http", {}) for s in self._worker_stats
        ])  # fmt: skip
        metrics["ray"] = self._ray_info()
        _write_json(self.run.out_dir / "metrics.json", metrics)
        outcome.metrics = metrics
        return outcome

    async def _collect_stats(self) -> None:
        stats = []
        for actor in self._actors:
            try:
                stats.append(await get(actor.stats.remote(), 10))
            except (RayError, TimeoutError):
                stats.append({"lost": True})
        self._worker_stats = stats

    def _ray_info(self) -> dict[str, Any]:
        return {
            "workers": [
                {
                    "node_id": node.node_id,
                    "node_ip": node.ip,
                    **{k: v for k, v in s.items() if k != "http"},
                }
                for node, s in zip(self._worker_nodes, self._worker_stats, strict=False)
            ],
            "replicas": self.servers.describe() if self.servers else [],
            "replicas_lost": self._lost,
            "requeued": self._queue.requeued if self._queue else 0,
        }


def _merge_http(parts: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    merged: dict[str, dict[str, int]] = {}
    for part in parts:
        for name, counters in part.items():
            into = merged.setdefault(name, {})
            for key, value in counters.items():
                into[key] = into.get(key, 0) + value
    return merged


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
