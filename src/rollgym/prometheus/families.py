"""The metric families of a scrape, built from what the process already counts.

Nothing here runs on a rollout's path: each family is read from live state when ``/metrics``
is scraped (the HTTP client's ``TargetStats``, its breakers and replica sets, the latency
histograms of ``rollgym.prometheus.latency``, the collector's counters). Every name starts with
``rollgym_``; the README's table lists them with their labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rollgym.http.breaker import CLOSED, HALF_OPEN, OPEN
from rollgym.prometheus.latency import Latency
from rollgym.prometheus.samples import Exported, GaugeSample, HistogramSample, Sample

if TYPE_CHECKING:
    from rollgym.collect.dispatch import Runner
    from rollgym.http import HttpClient
    from rollgym.server.base import BaseServer

PREFIX = "rollgym_"
BREAKER_STATES = (CLOSED, HALF_OPEN, OPEN)

# TargetStats field -> (counter name, help): the caller's view of each server it calls.
CLIENT_COUNTERS = {
    "calls": ("calls", "Calls made to a server (a call is retried within itself)."),
    "attempts": ("attempts", "Attempts sent to a server (the first one and every retry)."),
    "retries": ("retries", "Retries of calls to a server."),
    "failures": ("call_failures", "Calls to a server that failed for good (after retries)."),
    "budget_refused": (
        "budget_refusals",
        "Retries refused by a server's retry budget (the call failed instead).",
    ),
    "circuit_rejected": (
        "circuit_rejections",
        "Calls refused unsent because the server's circuit breaker was open.",
    ),
}


def client_families(client: HttpClient) -> Iterator[Metric]:
    """Calls, attempts, retries, refusals, breaker state and call latency per called server
    (and per replica), as one HTTP client counted them."""
    stats = client.stats()
    names = sorted(stats)
    for field, (name, help_text) in CLIENT_COUNTERS.items():
        family = CounterMetricFamily(PREFIX + name, help_text, labels=["server"])
        for server in names:
            family.add_metric([server], getattr(stats[server], field))
        yield family
    state = GaugeMetricFamily(
        PREFIX + "circuit_state",
        "Circuit breaker state per called server and replica: 1 for the state it is in.",
        labels=["server", "replica", "state"],
    )
    opened = CounterMetricFamily(
        PREFIX + "circuit_opened",
        "Times a circuit breaker opened, per called server and replica.",
        labels=["server", "replica"],
    )
    in_flight = GaugeMetricFamily(
        PREFIX + "replica_in_flight",
        "Calls in flight per called server and replica.",
        labels=["server", "replica"],
    )
    down = GaugeMetricFamily(
        PREFIX + "replica_down",
        "1 while a replica is out of rotation (it refused a connection).",
        labels=["server", "replica"],
    )
    for server in names:
        replicas = client.replicas(server)
        for i, breaker in enumerate(client.breakers(server)):
            replica = str(i)
            for each in BREAKER_STATES:
                state.add_metric([server, replica, each], 1.0 if breaker.state == each else 0.0)
            opened.add_metric([server, replica], breaker.opened)
            if replicas is not None:
                in_flight.add_metric([server, replica], replicas.outstanding[i])
                down.add_metric([server, replica], 1.0 if replicas.is_down(i) else 0.0)
    yield from (state, opened, in_flight, down)
    seconds = HistogramMetricFamily(
        PREFIX + "call_seconds",
        "Seconds of a call to a server, first attempt to answer or final error (retries and "
        "their waits included), by outcome (ok, failed).",
        labels=["server", "outcome"],
    )
    for server in names:
        latency = client.latency(server)
        if latency is not None:
            _add_histogram(seconds, [server, "ok"], latency.ok)
            _add_histogram(seconds, [server, "failed"], latency.failed)
    yield seconds


def runner_families(runner: Runner) -> Iterator[Metric]:
    """A rollout runner's circuit holds and failovers (the collector's, or a Ray worker's)."""
    yield CounterMetricFamily(
        PREFIX + "circuit_holds",
        "Times a rollout was held (and re-sent later) because a circuit was open.",
        value=runner.circuit_holds,
    )
    yield CounterMetricFamily(
        PREFIX + "failovers",
        "Rollouts sent to another agent replica after theirs was lost.",
        value=runner.failovers,
    )


def server_families(server: BaseServer) -> Iterator[Metric]:
    """A rollgym server's metrics: who it is, its calls to other servers, and its own."""
    info = GaugeMetricFamily(
        PREFIX + "server_info", "This rollgym server: 1, labelled.", labels=["server", "kind"]
    )
    info.add_metric([server.name, server.kind], 1.0)
    yield info
    yield from client_families(server.client)
    if isinstance(server, Exported):
        yield from sample_families(server.exported())


def sample_families(samples: Iterable[Sample]) -> Iterator[Metric]:
    """``GaugeSample``s (grouped by name) and ``HistogramSample``s as metric families."""
    gauges: dict[str, GaugeMetricFamily] = {}
    for sample in samples:
        if isinstance(sample, GaugeSample):
            family = gauges.get(sample.name)
            if family is None:
                family = gauges[sample.name] = GaugeMetricFamily(
                    PREFIX + sample.name, sample.help, labels=[k for k, _ in sample.labels]
                )
            family.add_metric([v for _, v in sample.labels], sample.value)
        elif isinstance(sample, HistogramSample):
            yield histogram_family(sample)
    yield from gauges.values()


def histogram_family(sample: HistogramSample) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + sample.name, sample.help, labels=[sample.label])
    for name in sorted(sample.latency.by_name):
        _add_histogram(family, [name], sample.latency.by_name[name])
    return family


def _add_histogram(family: HistogramMetricFamily, labels: list[str], latency: Latency) -> None:
    buckets = latency.cumulative()
    family.add_metric(labels, buckets, latency.total)
