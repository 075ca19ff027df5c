"""Every process of a real stack scraped while a run is alive: ``rollgym serve``'s three servers
and ``rollgym collect --metrics-port 0``."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import orjson
import pytest

from tests.support.waiting import wait_for

from .held_run import CONCURRENCY, ROLLOUTS, held_run
from .scrape import scrape_sync, value

pytestmark = pytest.mark.timeout(120)


def test_every_process_of_a_live_run_is_scraped(tmp_path: Path) -> None:
    with held_run(tmp_path) as run:
        # Every model call is held: the collector has `concurrency` rollouts in flight.
        def all_held() -> bool:
            return value(scrape_sync(run.collector), "rollgym_rollouts_in_flight") == CONCURRENCY

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

        assert run.release() == 0, "".join(run.stderr)
        # The collector's port closes with its run; the servers count every call it caused.
        with pytest.raises(urllib.error.URLError):
            scrape_sync(run.collector)
        agent = scrape_sync(run.servers["agent"] + "/metrics")
        assert value(agent, "rollgym_calls_total", server="model") == 2 * ROLLOUTS
        assert value(agent, "rollgym_agent_hop_seconds_count", hop="verify") == ROLLOUTS
        assert value(agent, "rollgym_replica_in_flight", server="model", replica="0") == 0
