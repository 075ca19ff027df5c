"""``scrape_targets.json``: the ``file_sd`` groups of a run (``rollgym.collect.scrape_targets``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from rollgym.collect.scrape_targets import TARGETS_FILE, TargetsFile, WorkerMetrics, scrape_targets


def test_groups_name_each_process_and_keep_a_path_prefix() -> None:
    groups = scrape_targets(
        "http://127.0.0.1:9100/metrics",
        {
            "model": ["http://10.0.0.1:8001", "http://10.0.0.2:8001/"],
            "agent": ["http://proxy:80/rollgym/agent"],  # behind a path
            "inproc": ["inprocess://inproc"],  # an agent run in the collector: no port
        },
        ["http://10.0.0.1:40001/metrics"],
    )
    assert groups == [
        {"targets": ["127.0.0.1:9100"], "labels": {"rollgym_process": "collector"}},
        {
            "targets": ["proxy:80"],
            "labels": {
                "rollgym_process": "server",
                "rollgym_server": "agent",
                "__metrics_path__": "/rollgym/agent/metrics",
            },
        },
        {
            "targets": ["10.0.0.1:8001", "10.0.0.2:8001"],
            "labels": {"rollgym_process": "server", "rollgym_server": "model"},
        },
        {"targets": ["10.0.0.1:40001"], "labels": {"rollgym_process": "collect_worker"}},
    ]


class _Workers:
    def __init__(self) -> None:
        self.metrics_urls = ["http://127.0.0.1:1/metrics"]
        self.callbacks: list[Callable[[], None]] = []

    def on_metrics_moved(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)


def test_the_file_follows_a_worker_that_moved_and_goes_with_the_run(tmp_path: Path) -> None:
    workers = _Workers()
    assert isinstance(workers, WorkerMetrics)
    targets = TargetsFile(tmp_path, "http://127.0.0.1:9/metrics", {}, workers)
    targets.write()

    def listed() -> list[str]:
        groups = orjson.loads((tmp_path / TARGETS_FILE).read_bytes())
        return [t for g in groups for t in g["targets"]]

    assert listed() == ["127.0.0.1:9", "127.0.0.1:1"]
    workers.metrics_urls = ["http://127.0.0.1:2/metrics"]
    for callback in workers.callbacks:
        callback()
    assert listed() == ["127.0.0.1:9", "127.0.0.1:2"]
    targets.remove()
    targets.remove()  # twice is fine
    assert not (tmp_path / TARGETS_FILE).exists()
