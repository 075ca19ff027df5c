"""The HTTP client's metric families: its calls, attempts, retries, refusals, breaker states and
call latency per called server (and per replica), read from the client's live counters when
``/metrics`` is scraped. Every process that calls others serves them (a server, the collector,
a Ray worker). Imported only at a scrape: it imports ``prometheus_client``.
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

from rollgym.http.breaker import CLOSED, HALF_OPEN, OPEN
from rollgym.prometheus.families import PREFIX, add_histogram

if TYPE_CHECKING:
    from rollgym.http.client import HttpClient

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
            add_histogram(seconds, [server, "ok"], latency.ok)
            add_histogram(seconds, [server, "failed"], latency.failed)
    yield seconds
