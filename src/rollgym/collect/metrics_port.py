"""The collector's metrics: the run's rollouts (in flight, remaining, done by outcome, failures
by type and server and by root cause, seconds, rewards by environment), its circuit holds and
failovers, and its calls to the agents.

Served on a port of the collector's own (``rollgym run --metrics-port``,
``rollgym.prometheus.exporter``); read from the collector's live state at each scrape. Imported
only for a run with ``--metrics-port``: it imports ``prometheus_client``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rollgym.collect.dispatch import LocalDispatcher
from rollgym.errors import ConfigError
from rollgym.http.metrics import client_families
from rollgym.launch.ports import bind_socket, socket_url
from rollgym.prometheus.exporter import MetricsServer
from rollgym.prometheus.exposition import Exposition
from rollgym.prometheus.families import PREFIX
from rollgym.prometheus.reward import Rewards

if TYPE_CHECKING:
    from rollgym.collect.collector import Collector
    from rollgym.collect.dispatch import Runner


def reward_family(rewards: Rewards) -> HistogramMetricFamily:
    """``rollgym_reward``: the scored rollouts' rewards, one series per environment."""
    family = HistogramMetricFamily(
        PREFIX + "reward",
        "Rewards of the scored rollouts (masked ones left out), by environment: the resources "
        "or environment server that verified them.",
        labels=["environment"],
    )
    for environment, (buckets, total) in rewards.cumulative().items():
        family.add_metric([environment], buckets, total)
    return family


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


def collector_families(collector: Collector) -> Iterator[Metric]:
    """Every family of one collector's scrape."""
    watch = collector.watch
    done = CounterMetricFamily(
        PREFIX + "rollouts",
        "Rollouts recorded by this collector, by outcome: succeeded, masked (recorded, "
        "reward no measurement), failed.",
        labels=["outcome"],
    )
    done.add_metric(["succeeded"], watch.succeeded)
    done.add_metric(["masked"], watch.masked)
    done.add_metric(["failed"], watch.failed)
    yield done
    failures = CounterMetricFamily(
        PREFIX + "rollout_failures",
        "Failed rollouts by the type and server of the error where the failure started.",
        labels=["type", "server"],
    )
    for (kind, server), n in sorted(watch.failures.items()):
        failures.add_metric([kind, server], n)
    yield failures
    causes = CounterMetricFamily(
        PREFIX + "rollout_failure_causes",
        "Failed rollouts by root cause (an error type: the deepest cause of the error's origin "
        "chain) and the deadline, budget or breaker that ended them (none if nothing did).",
        labels=["cause", "context"],
    )
    for (kind, context), n in sorted(watch.causes.items()):
        causes.add_metric([kind, context], n)
    yield causes
    in_flight = collector.in_flight()
    if in_flight is not None:
        yield GaugeMetricFamily(
            PREFIX + "rollouts_in_flight", "Rollouts being run now.", value=in_flight
        )
    yield GaugeMetricFamily(
        PREFIX + "rollouts_remaining",
        "Rollouts of the run without a record yet.",
        value=collector.ledger.pending,
    )
    seconds = HistogramMetricFamily(
        PREFIX + "rollout_seconds",
        "Seconds of a recorded rollout, from its dispatch to its record (circuit holds and "
        "re-runs included).",
    )
    seconds.add_metric([], watch.seconds.cumulative(), watch.seconds.total)
    yield seconds
    yield reward_family(watch.rewards)
    dispatcher = collector.dispatcher
    if isinstance(dispatcher, LocalDispatcher) and dispatcher.runner is not None:
        yield from runner_families(dispatcher.runner)
    yield from client_families(collector.client)


class CollectorMetrics:
    """The collector's ``/metrics`` on a port of its own, bound before the run starts (a port
    that cannot be bound fails the run before anything is written); the collector is attached
    once it exists (``attach``): until then a scrape answers no families."""

    def __init__(self, host: str, port: int) -> None:
        self.collector: Collector | None = None
        try:
            sock = bind_socket(host, port)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.server = MetricsServer(Exposition(self._families), sock, socket_url(sock))
        self.url = self.server.url

    def attach(self, collector: Collector) -> None:
        self.collector = collector

    def _families(self) -> Iterator[Metric]:
        if self.collector is not None:
            yield from collector_families(self.collector)
