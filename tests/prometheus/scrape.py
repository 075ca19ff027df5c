"""Scraping a rollgym process's ``/metrics`` and reading it with ``prometheus_client``'s own
parser (what a Prometheus server would take in)."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (sample name, labels) -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/plain")
        text: str = resp.read().decode()
        return text


def scrape_sync(url: str) -> Samples:
    return parse(fetch(url))


async def scrape(url: str) -> Samples:
    """``url``'s samples, fetched off the event loop (the servers answering run on it)."""
    return await asyncio.to_thread(scrape_sync, url)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; ``KeyError`` naming what there is."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        near = sorted(str(dict(k[1])) for k in samples if k[0] == name)
        raise KeyError(f"no {name}{labels}; there are: {near}")
    return samples[key]


def maybe(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly ``labels``, or ``None`` (not there yet: the collector
    serves no families until its run has started)."""
    return samples.get((name, frozenset(labels.items())))
