"""Every process of a real stack scraped while a run is alive: ``rollgym serve``'s three servers
and ``rollgym collect --metrics-port 0``."""

from __future__ import annotations

import subprocess
import urllib.error
from pathlib import Path

import orjson
import pytest
import yaml

from rollgym.http import HttpClient, Target
from rollgym.launch.ports import bind_socket
from rollgym.server.episode import Episode, ResourcesClient
from rollgym.testing import serve_server
from tests.support.stack import stack_data, task_row, write_tasks
from tests.support.waiting import wait_for

from .held_run import CONCURRENCY, ENV, ROLLGYM, ROLLOUTS, held_run
from .scrape import maybe, scrape_sync, value

pytestmark = pytest.mark.timeout(120)


def test_every_process_of_a_live_run_is_scraped(tmp_path: Path) -> None:
    with held_run(tmp_path) as run:
        # Every model call is held: the collector has `concurrency` rollouts in flight.
        def all_held() -> bool:
            return maybe(scrape_sync(run.collector), "rollgym_rollouts_in_flight") == CONCURRENCY

        wait_for(all_held, 30, "the rollouts to be in flight")
        ours = scrape_sync(run.collector)
        assert value(ours, "rollgym_rollouts_remaining") == ROLLOUTS
        assert value(ours, "rollgym_replica_in_flight", server="agent", replica="0") == CONCURRENCY
        agent = scrape_sync(run.servers["agent"] + "/metrics")
        assert value(agent, "rollgym_replica_in_flight", server="model", replica="0") == CONCURRENCY
        for name, kind in (("model", "model"), ("env", "resources"), ("agent", "agent")):
            own = scrape_sync(run.servers[name] + "/metrics")
            assert value(own, "rollgym_server_info", server=name, kind=kind) == 1
        run_json = orjson.loads((run.out / "run.json").read_bytes())
        assert run_json["metrics_url"] == run.collector
        assert run_json["status"] == "running"
        # scrape_targets.json (Prometheus file_sd) lists every one of those processes
        groups = orjson.loads((run.out / run_json["scrape_targets"]).read_bytes())
        listed = {
            g["labels"].get("rollgym_server", g["labels"]["rollgym_process"]): g["targets"]
            for g in groups
        }
        host = run.collector.split("/")[2]
        assert listed == {
            "collector": [host],
            **{name: [url.split("/")[2]] for name, url in run.servers.items()},
        }

        assert run.release() == 0, "".join(run.stderr)
        # The collector's port closes with its run; the servers count every call it caused.
        with pytest.raises(urllib.error.URLError):
            scrape_sync(run.collector)
        assert not (run.out / run_json["scrape_targets"]).exists()  # gone with the run
        agent = scrape_sync(run.servers["agent"] + "/metrics")
        assert value(agent, "rollgym_calls_total", server="model") == 2 * ROLLOUTS
        assert value(agent, "rollgym_agent_hop_seconds_count", hop="verify") == ROLLOUTS
        assert value(agent, "rollgym_replica_in_flight", server="model", replica="0") == 0


def test_a_metrics_port_in_use_fails_the_run_before_anything_is_written(tmp_path: Path) -> None:
    busy = bind_socket()
    port = busy.getsockname()[1]
    try:
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(yaml.safe_dump(stack_data()))
        tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
        out = tmp_path / "out"
        done = subprocess.run(
            [ROLLGYM, "run", str(cfg), "-i", str(tasks), "-o", str(out), "--metrics-port",
             str(port)],
            env=ENV, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        busy.close()
    assert done.returncode == 2, done.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


async def test_an_agent_never_calls_a_tool_named_metrics() -> None:
    async with serve_server("echo", name="env") as (url, _), HttpClient() as client:
        resources = ResourcesClient(client, Target.single("env", url))
        episode = Episode(resources, "r1")
        await episode.seed(task_row(0))
        answer = await episode.call_tool("metrics", {})
    assert "unknown tool 'metrics'" in answer
