"""``RayDispatcher``: the collector's dispatch spread over ``CollectWorker`` actors.

Only dispatch differs from a local run: the run directory, the ledger, resume, the failure
budget and metrics are the one collector's, and each worker runs the one rollout core. The
driver feeds each worker chunks of pending rollouts over a few lanes (so a worker always has the
next chunk queued while it finishes one); workers stream records back as they finish and the
driver hands them to the recorder, which alone writes them. So the output stays one ledger,
every rollout recorded once:

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
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayError

from rollgym.collect.dispatch import DispatchReport, Feed, Work, cancel_others
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import RolloutItem
from rollgym.collect.rollout import RolloutPolicy
from rollgym.errors import LaunchError
from rollgym.http import HttpClient, Target
from rollgym.ray.placement import NodeInfo, alive_nodes, get, on_node, spread
from rollgym.ray.servers import RayServers
from rollgym.ray.worker import CollectWorkerActor, WorkerBatch

log = logging.getLogger("rollgym.ray")

LANES = 2
"""Chunks in flight per worker: one running, one queued behind it."""
MONITOR_INTERVAL = 0.5
RESTART_WAIT_S = 60.0
"""How long a crashed worker may take to come back before its lanes give up on it."""


class _WorkQueue:
    """Pending rollouts: a stream from ``tasks.jsonl`` plus rollouts handed back by a worker
    that died. ``take`` waits while work is out that may still come back. A ``Feed`` (the
    streaming API's) is its own queue: it takes back what a dead worker did not finish, and
    waits for work itself."""

    def __init__(self, source: Work) -> None:
        self._feed = source if isinstance(source, Feed) else None
        self.feeds = self._feed is not None
        self._source: Iterator[RolloutItem] = iter(()) if isinstance(source, Feed) else source
        self._returned: deque[RolloutItem] = deque()
        self._out = 0
        self._changed = asyncio.Event()
        self.requeued = 0

    async def take(self, n: int) -> list[RolloutItem]:
        """Up to ``n`` items; an empty list once everything has been handed out for good."""
        if self._feed is not None:
            return await self._feed.take(n)
        while True:
            items: list[RolloutItem] = []
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

    @property
    def out(self) -> int:
        """Rollouts taken and not yet finished (a ``Feed`` counts its own: 0 here)."""
        return self._out

    def give_back(self, items: list[RolloutItem]) -> None:
        if self._feed is not None:
            self._feed.requeue(items)
            self.requeued += len(items)
            return
        self._returned.extend(items)
        self.requeued += len(items)
        self.finished(len(items))


def _islice(it: Iterator[RolloutItem], n: int) -> list[RolloutItem]:
    out: list[RolloutItem] = []
    for item in it:
        out.append(item)
        if len(out) >= n:
            break
    return out


class RayDispatcher:
    """Dispatch over ``workers`` actors (default: one per live node), at most ``concurrency``
    rollouts in flight in all. ``servers``: the run's ``RayServers``, whose lost replicas are
    then taken out of every worker's rotation (None for servers running elsewhere).
    ``worker_metrics``: each worker serves Prometheus metrics, bound as that host says
    (``rollgym.ray.worker``); None: off."""

    def __init__(
        self,
        policy: RolloutPolicy,
        concurrency: int,
        *,
        servers: RayServers | None = None,
        workers: int | None = None,
        worker_cpus: float = 0.0,
        worker_metrics: str | None = None,
    ) -> None:
        self.policy = policy
        self.worker_metrics = worker_metrics
        self._moved: list[Callable[[], None]] = []
        self.concurrency = concurrency
        self.servers = servers
        self.n_workers = workers
        self.worker_cpus = worker_cpus
        self._actors: list[Any] = []
        self._worker_nodes: list[NodeInfo] = []  # where each worker was meant to run
        self._where: list[dict[str, Any]] = []  # where it runs: node_id, pid (from ready())
        self._restarts: list[int] = []
        self._locks: list[asyncio.Lock] = []  # one per worker: its lanes repair it once
        self._agents: dict[str, Target] = {}
        self._per_worker = 1
        self._lanes: list[asyncio.Task[None]] = []
        self._down: set[str] = set()
        self._lost: list[dict[str, Any]] = []
        self._queue: _WorkQueue | None = None
        self._cancelled = False
        self._settled: list[int] = []
        """Per worker: the records the driver took from it (recorded, or a late duplicate
        dropped) since it last started: ``abandoned``."""
        self._handed: list[dict[tuple[int, int], RolloutItem]] = []
        """Per lane: the rollouts handed to its worker and not recorded yet."""
        self._cancels: list[Any] = []

    @property
    def actors(self) -> list[Any]:
        """The worker actors' handles (empty before ``start`` and after ``close``)."""
        return list(self._actors)

    @property
    def placements(self) -> list[dict[str, Any]]:
        """Where each worker runs now: its ``node_id`` and ``pid`` (and ``metrics_url``)."""
        return [dict(w) for w in self._where]

    @property
    def metrics_urls(self) -> list[str]:
        """Each worker's ``/metrics`` URL now (empty without ``worker_metrics``)."""
        return [w["metrics_url"] for w in self._where if w.get("metrics_url")]

    def on_metrics_moved(self, callback: Callable[[], None]) -> None:
        """``callback()`` whenever a worker's metrics URL changes (it was restarted or
        replaced): a run's scrape targets follow it (``rollgym.collect.scrape_targets``)."""
        self._moved.append(callback)

    # -- the dispatch -------------------------------------------------------------------------

    async def start(self, http: HttpClient, agents: dict[str, Target]) -> None:
        """Start the worker actors (the driver's own client is not used: workers have theirs)."""
        nodes = alive_nodes()
        n = self.n_workers or len(nodes)
        self._agents = agents
        self._per_worker = max(1, math.ceil(self.concurrency / n))
        for index, (_, node) in enumerate(spread(range(n), nodes)):
            self._actors.append(self._spawn(node, index))
            self._worker_nodes.append(node)
            self._locks.append(asyncio.Lock())
        self._where = await get([a.ready.remote() for a in self._actors], 120)
        self._restarts = [0] * len(self._actors)
        self._settled = [0] * len(self._actors)

    def _spawn(self, node: NodeInfo, index: int) -> Any:
        # Hard affinity: a zero-CPU actor with soft affinity may land on any node, and two
        # workers meant for two nodes then share one. Ray restarts a crashed worker on its node;
        # a worker whose node is gone is replaced on a live one (``_alive``).
        return CollectWorkerActor.options(
            num_cpus=self.worker_cpus, scheduling_strategy=on_node(node, soft=False)
        ).remote(
            self._agents, concurrency=self._per_worker, policy=self.policy, index=index,
            metrics_host=self.worker_metrics,
        )  # fmt: skip

    async def dispatch(self, work: Work, pending: int, recorder: Recorder) -> None:
        """Feed the workers until every item has a record, watching the replicas meanwhile."""
        self._queue = _WorkQueue(work)
        self._handed = [{} for _ in range(len(self._actors) * LANES)]
        self._lanes = [
            asyncio.create_task(self._lane(i * LANES + lane, recorder))
            for i in range(len(self._actors))
            for lane in range(LANES)
        ]
        monitor = asyncio.create_task(self._watch_replicas())
        try:
            await asyncio.gather(*self._lanes, return_exceptions=True)
        finally:
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)

    def cancel(self) -> None:
        # Set first: the lane whose record called this (a budget's cap) is not cancelled, and
        # must record nothing more of its batch, nor take more work.
        self._cancelled = True
        cancel_others(self._lanes)
        # Their rollouts stay pending; each worker answers how many it had started, read by
        # ``report`` (``abandoned``: started and not recorded, as a local run counts them).
        self._cancels = [actor.cancel.remote() for actor in self._actors]

    def cancelled(self) -> bool:
        """Whether ``cancel`` was called (a method: a record may call it mid-loop)."""
        return self._cancelled

    @property
    def in_flight(self) -> int | None:
        """Rollouts handed to the workers and not yet recorded, queued there too (a stream's
        feed: not known): the live progress's; at a budget's cancel, ``report`` says how many
        of them had started (``abandoned``)."""
        queue = self._queue
        return None if queue is None or queue.feeds else queue.out

    async def close(self) -> None:
        actors, self._actors = self._actors, []
        for actor in actors:
            with contextlib.suppress(RayError, TimeoutError):
                await get(actor.close.remote(), 10)
            with contextlib.suppress(Exception):
                ray.kill(actor)

    async def report(self) -> DispatchReport:
        stats = await self._collect_stats(self._actors)
        return DispatchReport(
            circuit_holds=sum(s.get("circuit_holds", 0) for s in stats),
            failovers=sum(s.get("failovers", 0) for s in stats),
            http=[s.get("http", {}) for s in stats],
            sections={"ray": self._ray_info(stats)},
            abandoned=await self._abandoned(),
        )

    async def _abandoned(self) -> int | None:
        """After ``cancel``: the rollouts the workers had started (sent to their agent) and the
        driver did not record, running or finished beside the record that reached the cap;
        not those queued on a worker, never started (None: not cancelled). A worker that does
        not answer counts every rollout handed to it and not recorded (it may have started
        them)."""
        if not self._cancels:
            return None
        abandoned = 0
        for worker, ref in enumerate(self._cancels):
            handed = sum(len(self._handed[worker * LANES + lane]) for lane in range(LANES))
            try:
                started = int(await get(ref, 10))
            except (RayError, TimeoutError):
                abandoned += handed
                continue
            abandoned += max(0, min(handed, started - self._settled[worker]))
        return abandoned

    # -- workers ------------------------------------------------------------------------------

    def _chunk(self) -> int:
        return max(1, math.ceil(self.concurrency / max(1, len(self._actors))))

    async def _lane(self, index: int, recorder: Recorder) -> None:
        try:
            await self._feed(index, recorder)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            recorder.crashed("collect lane", exc)

    async def _feed(self, index: int, recorder: Recorder) -> None:
        """Hand lane ``index``'s worker chunk after chunk and record what comes back, until no
        work is left (or the worker is dead for good)."""
        assert self._queue is not None
        queue = self._queue
        worker = index // LANES
        while not (recorder.aborted or self.cancelled()):
            await recorder.resumed.wait()
            actor = self._actors[worker]  # a replaced worker is a new actor
            items = await queue.take(self._chunk())
            if not items:
                return
            out = {(item.task_index, item.rollout_index): item for item in items}
            self._handed[index] = out
            try:
                async for ref in actor.run.remote(items, sorted(self._down)):
                    batch: WorkerBatch = await ref
                    if batch.held is not None:
                        recorder.held(batch.held)
                    for record in batch.records:
                        if self.cancelled():  # by the record before (a budget's abandon)
                            return  # the rest stay pending: abandoned, left for --resume
                        self._settled[worker] += 1
                        if out.pop((record.task_index, record.rollout_index), None) is not None:
                            queue.finished(1)  # first: no longer in flight as it is recorded
                            recorder.record(record)  # a late duplicate is dropped there
            except RayError as exc:
                log.warning("collect worker %d failed (%s); %d rollouts go back in the queue",
                            worker, type(exc).__name__, len(out))  # fmt: skip
                queue.give_back(list(out.values()))
                out.clear()
                if recorder.abort_reason is not None:
                    return  # no repair for a run that is stopping
                if not await self._alive(worker, actor):
                    log.error("collect worker %d is gone for good", worker)
                    return
                continue
            if out and not recorder.aborted:
                queue.give_back(list(out.values()))  # not expected: run them elsewhere
            elif out:
                queue.finished(len(out))  # cancelled by the abort: they stay pending
            out.clear()

    async def _alive(self, index: int, failed: Any) -> bool:
        """Worker ``index`` (the actor ``failed``) failed: wait while Ray restarts it (its
        process crashed), or replace it on a live node (its node died). False if neither
        works. Both lanes of a worker come here; the first repairs it, the other sees that."""
        async with self._locks[index]:
            if self._actors[index] is not failed:
                return True  # the other lane already repaired it
            if await self._restarted(index):
                return True
            return await self._replace(index)

    async def _restarted(self, index: int) -> bool:
        """A restarting worker answers "unavailable" for a while: that is not dead. False once
        Ray says it is dead for good, or it stays away for ``RESTART_WAIT_S``."""
        deadline = time.monotonic() + RESTART_WAIT_S
        home = self._worker_nodes[index].node_id
        while time.monotonic() < deadline:
            if home not in {n.node_id for n in alive_nodes()}:
                return False  # its node is gone: Ray cannot restart it there
            try:
                where = await get(self._actors[index].ready.remote(), 2.0)
            except ActorDiedError:
                return False
            except (RayError, TimeoutError):
                await asyncio.sleep(0.5)
                continue
            self._placed(index, where)
            return True
        return False

    async def _replace(self, index: int) -> bool:
        """A new worker for ``index`` on a live node (its own node is gone)."""
        try:
            nodes = alive_nodes()
            node = nodes[index % len(nodes)]
            actor = self._spawn(node, index)
            where = await get(actor.ready.remote(), RESTART_WAIT_S)
        except (RayError, TimeoutError, LaunchError) as exc:
            log.error("collect worker %d could not be replaced: %s", index, exc)
            return False
        log.warning("collect worker %d replaced on node %s", index, node.node_id)
        self._actors[index] = actor
        self._worker_nodes[index] = node
        self._placed(index, where)
        return True

    def _placed(self, index: int, where: dict[str, Any]) -> None:
        """Note where worker ``index`` really runs (a new pid: Ray restarted it)."""
        known = self._where[index]
        if known and known.get("pid") != where.get("pid"):
            self._restarts[index] += 1
            self._settled[index] = 0  # a new process: its ``started`` begins at 0 again
            log.warning("collect worker %d was restarted (pid %s -> %s)", index,
                        known.get("pid"), where.get("pid"))  # fmt: skip
        self._where[index] = where
        if known.get("metrics_url") != where.get("metrics_url"):
            for callback in self._moved:
                try:
                    callback()
                except Exception:  # the run goes on without fresh targets; say why
                    log.exception("updating the scrape targets failed")

    async def _collect_stats(self, actors: list[Any]) -> list[dict[str, Any]]:
        stats = []
        for actor in actors:
            try:
                stats.append(await get(actor.stats.remote(), 10))
            except (RayError, TimeoutError):
                stats.append({"lost": True})
        return stats

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
            urls = [rep.url for rep in lost]
            for actor in self._actors:
                actor.mark_down.remote(urls)

    def _ray_info(self, stats: list[dict[str, Any]]) -> dict[str, Any]:
        ips = {n.node_id: n.ip for n in alive_nodes()}
        workers = []
        for i, (planned, s) in enumerate(zip(self._worker_nodes, stats, strict=False)):
            where = self._where[i] if i < len(self._where) else {}
            node_id = where.get("node_id", planned.node_id)
            workers.append(
                {
                    "node_id": node_id,
                    "node_ip": ips.get(node_id),
                    "planned_node_id": planned.node_id,
                    "pid": where.get("pid"),
                    **({"metrics_url": where["metrics_url"]} if "metrics_url" in where else {}),
                    # Counters start again in a restarted worker: they cover its last life.
                    "restarts": self._restarts[i] if i < len(self._restarts) else 0,
                    **{k: v for k, v in s.items() if k != "http"},
                }
            )
        return {
            "workers": workers,
            "replicas": self.servers.describe() if self.servers else [],
            "replicas_lost": self._lost,
            "requeued": self._queue.requeued if self._queue else 0,
        }
