"""A rollgym server's metric families (its ``GET /metrics``): who it is, its calls to other
servers, and the numbers of its own it exports (``rollgym.prometheus.samples.Exported``).

Imported at the first scrape (``server.app``), never at start-up: it imports
``prometheus_client``, an extra a server may lack (``/metrics`` then answers 501 saying so).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from rollgym.http.metrics import client_families
from rollgym.prometheus.families import PREFIX, sample_families
from rollgym.prometheus.samples import Exported

if TYPE_CHECKING:
    from rollgym.server.base import BaseServer


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
