"""A run's scrape targets: every process of a live run that serves ``/metrics``, written to
``scrape_targets.json`` in its run directory in Prometheus's ``file_sd`` format.

A run started with ``--metrics-port`` writes it once its servers and workers are up, rewrites
it when one moves (a Ray worker restarted or replaced: a new port), and removes it when the run
ends (its ports close then). Prometheus re-reads a ``file_sd_configs`` file when it changes, so
a run on Ray, whose servers and workers take ports nobody can know in advance, is scraped
whole without a config edit:

    scrape_configs:
      - job_name: rollgym
        file_sd_configs: [{files: ["/runs/*/scrape_targets.json"]}]

Servers given by URL in the config (``url:``) are not rollgym processes and serve no
``/metrics``: they are left out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from rollgym.collect.rundir import write_json
from rollgym.wire import METRICS_ENDPOINT

TARGETS_FILE = "scrape_targets.json"


@runtime_checkable
class WorkerMetrics(Protocol):
    """A dispatcher whose workers serve metrics of their own (``rollgym.ray.RayDispatcher``)."""

    @property
    def metrics_urls(self) -> list[str]:
        """Each worker's ``/metrics`` URL now."""
        ...

    def on_metrics_moved(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a worker's URL changes."""
        ...


def _group(urls: Sequence[str], labels: dict[str, str]) -> list[dict[str, Any]]:
    """``file_sd`` groups for ``urls`` (each a process's ``/metrics`` URL): one per metrics
    path, since a group's targets are ``host:port`` and share their labels."""
    by_path: dict[str, list[str]] = {}
    for url in urls:
        parts = urlsplit(url)
        by_path.setdefault(parts.path or METRICS_ENDPOINT, []).append(parts.netloc)
    groups = []
    for path, hosts in by_path.items():
        extra = {} if path == METRICS_ENDPOINT else {"__metrics_path__": path}
        groups.append({"targets": hosts, "labels": {**labels, **extra}})
    return groups


def scrape_targets(
    collector: str, servers: Mapping[str, Sequence[str]], workers: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The ``file_sd`` groups of a run: the collector's metrics URL, each server's base URLs
    (their ``/metrics``), the Ray workers' metrics URLs."""
    groups = _group([collector], {"rollgym_process": "collector"})
    for name, urls in sorted(servers.items()):
        http = [u.rstrip("/") + METRICS_ENDPOINT for u in urls if u.startswith(("http:", "https:"))]
        if http:
            groups += _group(http, {"rollgym_process": "server", "rollgym_server": name})
    if workers:
        groups += _group(list(workers), {"rollgym_process": "collect_worker"})
    return groups


class TargetsFile:
    """``scrape_targets.json`` of one run: ``write`` (again whenever a worker moves), then
    ``remove`` when the run ends."""

    def __init__(
        self,
        out_dir: Path,
        collector: str,
        servers: Mapping[str, Sequence[str]],
        workers: WorkerMetrics | None = None,
    ) -> None:
        self.path = out_dir / TARGETS_FILE
        self.collector = collector
        self.servers = servers
        self.workers = workers
        if workers is not None:
            workers.on_metrics_moved(self.write)

    def write(self) -> None:
        urls = self.workers.metrics_urls if self.workers is not None else []
        write_json(self.path, scrape_targets(self.collector, self.servers, urls))

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
