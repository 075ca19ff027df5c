"""Every server's ``GET /metrics`` and the collector's own port, scraped for real (servers on
127.0.0.1 sockets, the collector in this process) and read with ``prometheus_client``'s parser:
the counts must be the ones the run made."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import Collector, prepare_run
from rollgym.collect.metrics_port import CollectorMetrics
from rollgym.errors import ConfigError, HTTPStatusError
from rollgym.http import HttpClient, Target
from rollgym.http.metrics import client_families
from rollgym.prometheus.exposition import Exposition
from rollgym.server.resources import ResourcesServer, tool
from rollgym.testing import serve_server
from rollgym.wire import RESERVED_ENDPOINTS
from tests.support.servers import FAIL_MARKER
from tests.support.stack import fast_policy, running_stack, stack_config, task_row, write_tasks

from .scrape import parse, scrape, value

pytestmark = pytest.mark.timeout(60)


async def post(url: str, body: Any) -> tuple[int, Any]:
    def send() -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            url, data=orjson.dumps(body), headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, orjson.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, orjson.loads(err.read())

    return await asyncio.to_thread(send)


async def test_a_run_counts_rollouts_retries_and_hops_on_every_process(tmp_path: Path) -> None:
    n, failing = 10, {2, 5, 7}
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, fail=failing)
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        cfg = stack_config()
        prepared = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        metrics = CollectorMetrics("127.0.0.1", 0)
        async with metrics.server:
            collector = Collector(prepared, stack.urls, agent="agent", progress=False)
            metrics.attach(collector)
            outcome = await collector.execute()
            assert outcome.metrics["counts"]["failed"] == len(failing)
            ours = await scrape(metrics.url)
        agent = await scrape(stack.urls["agent"][0] + "/metrics")
        model = await scrape(stack.urls["model"][0] + "/metrics")

    ok = n - len(failing)
    # The collector: N rollouts, by outcome; the failures by type and server; one /run each.
    assert value(ours, "rollgym_rollouts_total", outcome="succeeded") == ok
    assert value(ours, "rollgym_rollouts_total", outcome="failed") == len(failing)
    assert value(ours, "rollgym_rollouts_total", outcome="masked") == 0
    by_model = [
        v for (name, labels), v in ours.items()
        if name == "rollgym_rollout_failures_total" and ("server", "model") in labels
    ]  # fmt: skip
    assert by_model == [len(failing)]
    assert value(ours, "rollgym_calls_total", server="agent") == n
    assert value(ours, "rollgym_attempts_total", server="agent") == n
    assert value(ours, "rollgym_rollout_seconds_count") == n
    # The failing rollouts' /run answered 502: failed calls, with their own latency.
    assert value(ours, "rollgym_call_seconds_count", server="agent", outcome="ok") == ok
    assert value(ours, "rollgym_call_seconds_count", server="agent", outcome="failed") == len(
        failing
    )
    assert value(ours, "rollgym_rollouts_in_flight") == 0
    assert value(ours, "rollgym_rollouts_remaining") == 0

    # The agent: each failing rollout's one model call failed after every attempt (a 500 is
    # retried under the model's policy); every other rollout made two model calls.
    attempts = fast_policy("model").max_attempts
    assert attempts > 1
    model_calls = 2 * ok + len(failing)
    assert value(agent, "rollgym_calls_total", server="model") == model_calls
    assert value(agent, "rollgym_retries_total", server="model") == len(failing) * (attempts - 1)
    assert value(agent, "rollgym_attempts_total", server="model") == (
        2 * ok + len(failing) * attempts
    )
    assert value(agent, "rollgym_call_failures_total", server="model") == len(failing)
    assert value(agent, "rollgym_retries_total", server="env") == 0
    assert value(agent, "rollgym_call_seconds_count", server="model", outcome="failed") == len(
        failing
    )
    # Per hop, from the agent's own timing: failed rollouts' hops too.
    assert value(agent, "rollgym_agent_hop_seconds_count", hop="seed") == n
    assert value(agent, "rollgym_agent_hop_seconds_count", hop="model") == model_calls
    assert value(agent, "rollgym_agent_hop_seconds_count", hop="tool") == ok
    assert value(agent, "rollgym_agent_hop_seconds_count", hop="verify") == ok
    assert value(agent, "rollgym_circuit_state", server="model", replica="0", state="closed") == 1
    assert value(agent, "rollgym_server_info", server="agent", kind="agent") == 1
    assert value(model, "rollgym_server_info", server="model", kind="model") == 1


async def test_an_open_breaker_shows_as_open_and_its_rejections_are_counted() -> None:
    breaker = {"enabled": True, "consecutive_failures": 2, "cooldown": 60.0}
    async with running_stack(
        model_options={"fail_marker": FAIL_MARKER}, model_retry={"breaker": breaker}
    ) as stack:
        agent_url = stack.agent_url
        statuses = [(await post(agent_url + "/run", task_row(i, fail=True)))[0] for i in range(4)]
        assert all(s >= 500 for s in statuses), statuses
        after = await scrape(agent_url + "/metrics")
    assert value(after, "rollgym_circuit_state", server="model", replica="0", state="open") == 1
    assert value(after, "rollgym_circuit_state", server="model", replica="0", state="closed") == 0
    assert value(after, "rollgym_circuit_opened_total", server="model", replica="0") == 1
    # Two calls failed and opened it; the next two were refused unsent.
    assert value(after, "rollgym_circuit_rejections_total", server="model") == 2
    assert value(after, "rollgym_calls_total", server="model") == 4


async def test_each_replica_has_its_breaker_load_and_down_mark(
    dead_url: Callable[[], str],
) -> None:
    async with serve_server("echo", name="env") as (live_url, _):
        target = Target("env", (live_url, dead_url()), fast_policy("resources", max_attempts=3))
        async with HttpClient() as client:
            for _ in range(4):
                await client.call(target, "/health", {})
            text, _ = Exposition(lambda: client_families(client)).render(None)
    samples = parse(text.decode())
    assert value(samples, "rollgym_replica_down", server="env", replica="1") == 1
    assert value(samples, "rollgym_replica_down", server="env", replica="0") == 0
    assert value(samples, "rollgym_replica_in_flight", server="env", replica="0") == 0
    for replica in ("0", "1"):
        state = value(
            samples, "rollgym_circuit_state", server="env", replica=replica, state="closed"
        )
        assert state == 1
    assert value(samples, "rollgym_calls_total", server="env") == 4
    assert value(samples, "rollgym_call_failures_total", server="env") == 0


def test_metrics_is_a_reserved_endpoint_no_tool_may_take() -> None:
    assert "metrics" in RESERVED_ENDPOINTS
    with pytest.raises(TypeError, match="metrics"):

        class Sneaky(ResourcesServer):
            @tool
            async def metrics(self, session: Any) -> str:
                return "not the metrics"


async def test_the_collector_port_answers_only_get_metrics(tmp_path: Path) -> None:
    async with CollectorMetrics("127.0.0.1", 0).server as server:
        host, port = server.url.split("//")[1].split("/")[0].split(":")

        async def ask(raw: bytes) -> bytes:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(raw)
            await writer.drain()
            async with asyncio.timeout(10):
                answer = await reader.read()
            writer.close()
            return answer

        assert (await ask(b"GET /other HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 404")
        assert (await ask(b"POST /metrics HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await ask(b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400")
        # Before the collector exists: an empty, valid exposition.
        ok = await ask(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"\r\n\r\n")
        # A head longer than the limit is cut, not buffered.
        assert await ask(b"GET /metrics HTTP/1.1\r\nx: " + b"a" * 40_000 + b"\r\n\r\n") == b""


async def test_a_metrics_port_in_use_is_a_clear_error() -> None:
    async with CollectorMetrics("127.0.0.1", 0).server as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(ConfigError, match=f"--metrics-port {port}: cannot listen"):
            CollectorMetrics("127.0.0.1", port)


def test_without_prometheus_client_metrics_answer_501(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(HTTPStatusError, match=r"rollgym\[metrics\]") as caught:
        Exposition(lambda: []).render(None)
    assert caught.value.status == 501


async def test_a_scraper_that_asks_for_openmetrics_gets_it() -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    async with running_stack() as stack:
        await post(stack.agent_url + "/run", task_row(0))

        def fetch() -> tuple[str, str]:
            import urllib.request

            accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            req = urllib.request.Request(stack.agent_url + "/metrics", headers={"accept": accept})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.headers["content-type"], resp.read().decode()

        content_type, text = await asyncio.to_thread(fetch)
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    calls = families["rollgym_calls"]
    assert calls.type == "counter"
    assert {s.labels["server"]: s.value for s in calls.samples if s.name.endswith("_total")} == {
        "model": 2,
        "env": 3,
    }
