"""A real Prometheus server scrapes every process of a live run, found through the run's
``scrape_targets.json`` (``file_sd``) (opt-in: skipped without the
``prometheus`` binary; on Debian ``apt-get install prometheus``, about 20 s)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from rollgym.launch.ports import bind_socket
from tests.support.waiting import wait_for

from .held_run import CONCURRENCY, ROLLOUTS, held_run

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)"
    ),
]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        answer = orjson.loads(resp.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def query(base: str, expr: str) -> float | None:
    result = api(base, "query", query=expr)["result"]
    return float(result[0]["value"][1]) if result else None


def free_port() -> int:
    # Prometheus binds its own port: take a free one and hand it over (a small race, retried).
    sock = bind_socket()
    try:
        return int(sock.getsockname()[1])
    finally:
        sock.close()


def test_prometheus_scrapes_the_collector_and_every_server(tmp_path: Path) -> None:
    assert PROMETHEUS is not None
    with held_run(tmp_path) as run:
        targets = [run.collector.removesuffix("/metrics"), *run.servers.values()]
        # The run's own scrape_targets.json, as a user would point Prometheus at it.
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "rollgym",
                    "file_sd_configs": [
                        {"files": [str(run.out / "scrape_targets.json")], "refresh_interval": "1s"}
                    ],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        proc = None
        base = ""
        for _ in range(3):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115
            )  # fmt: skip
            time.sleep(0.5)
            if proc.poll() is None:
                break
        assert proc is not None and proc.poll() is None, (tmp_path / "prometheus.log").read_text()
        try:

            def all_up() -> bool:
                try:
                    active = api(base, "targets")["activeTargets"]
                except OSError:
                    return False
                return len(active) == len(targets) and all(t["health"] == "up" for t in active)

            wait_for(all_up, 60, "Prometheus to scrape every target")

            def held_seen() -> bool:
                return query(base, "rollgym_rollouts_in_flight") == CONCURRENCY

            wait_for(held_seen, 30, "Prometheus to see the rollouts in flight")
            assert query(base, 'sum(rollgym_server_info{kind="agent"})') == 1
            assert query(base, "count(rollgym_server_info)") == 3
            # the file's labels reach every series
            assert query(base, 'count(rollgym_server_info{rollgym_process="server"})') == 3
            assert query(base, 'rollgym_rollouts_remaining{rollgym_process="collector"}') == (
                ROLLOUTS
            )
            assert query(base, "rollgym_rollouts_remaining") == ROLLOUTS

            assert run.release() == 0, "".join(run.stderr)
            calls = 'rollgym_calls_total{server="model"}'

            def all_calls_seen() -> bool:
                return query(base, calls) == 2 * ROLLOUTS

            wait_for(all_calls_seen, 30, "Prometheus to see every model call")
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
