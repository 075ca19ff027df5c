"""A Ray collect worker's metrics (``rollgym.ray.worker``): its rollouts in flight and queued,
the records it sent the driver, its circuit holds and failovers, and its calls to the agents.

Served on a port of the worker's own (``rollgym.prometheus.exporter.MetricsServer``), read
from its live state at each scrape; imported at the first one (it imports ``prometheus_client``). Its rollout counter has a name of its own (``rollgym_worker_rollouts``): the driver's
``rollgym_rollouts`` counts the same rollouts as they are recorded, and a sum over every
process of a run must not count them twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rollgym.collect.metrics_port import runner_families
from rollgym.http.metrics import client_families
from rollgym.prometheus.families import PREFIX

if TYPE_CHECKING:
    from rollgym.collect.rollout import RolloutRunner


class Worker(Protocol):
    """What a scrape reads of a collect worker (``rollgym.ray.worker.CollectWorker``, which
    imports this module at its first scrape: named here, it would make the two a cycle)."""

    @property
    def index(self) -> int: ...
    @property
    def node_id(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def finished(self) -> int: ...
    @property
    def runner_if_started(self) -> RolloutRunner | None: ...


def worker_families(worker: Worker) -> Iterator[Metric]:
    """Every family of one worker's scrape."""
    info = GaugeMetricFamily(
        PREFIX + "worker_info",
        "1, labelled with this collect worker's index in its run, Ray node and process id.",
        labels=["worker", "node_id", "pid"],
    )
    info.add_metric([str(worker.index), worker.node_id, str(worker.pid)], 1)
    yield info
    yield GaugeMetricFamily(
        PREFIX + "rollouts_in_flight", "Rollouts being run now.", value=worker.running
    )
    yield GaugeMetricFamily(
        PREFIX + "worker_rollouts_queued",
        "Rollouts handed to this worker and waiting for a slot (its concurrency).",
        value=worker.queued,
    )
    yield CounterMetricFamily(
        PREFIX + "worker_rollouts",
        "Rollouts this worker finished and sent the driver (since its process started).",
        value=worker.finished,
    )
    runner = worker.runner_if_started
    if runner is not None:
        yield from runner_families(runner)
        yield from client_families(runner.http)
