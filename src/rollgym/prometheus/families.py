"""The metric families of a scrape, built from what the process already counts.

Nothing here runs on a rollout's path: each family is read from live state when ``/metrics``
is scraped. This module holds what every source shares (the ``rollgym_`` prefix, histograms of
``rollgym.prometheus.latency``, a server's own ``Sample``s); what describes one source lives
with it: the HTTP client's calls in ``rollgym.http.metrics``, a server's in
``rollgym.server.metrics``, the collector's in ``rollgym.collect.metrics_port``, a Ray worker's
in ``rollgym.ray.metrics``. Every name starts with ``rollgym_``; the README's table lists them
with their labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rollgym.prometheus.latency import Latency
from rollgym.prometheus.samples import GaugeSample, HistogramSample, Sample

PREFIX = "rollgym_"


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
        add_histogram(family, [name], sample.latency.by_name[name])
    return family


def add_histogram(family: HistogramMetricFamily, labels: list[str], latency: Latency) -> None:
    buckets = latency.cumulative()
    family.add_metric(labels, buckets, latency.total)
