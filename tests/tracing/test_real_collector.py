"""Opt-in: a real run's traces through a real OpenTelemetry Collector (``otelcol-contrib``, whose
``file`` exporter writes what it received as OTLP JSON lines).

Skipped unless ``ROLLGYM_OTELCOL`` names the binary or ``otelcol-contrib`` is on ``PATH``: no
collector (nor Jaeger) installs from PyPI, Debian or npm, so this test has not run on the machine
it was written on; the normal suite's ``test_run_traces`` checks the same traces with a receiver
that decodes the OTLP protobuf itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.launch.ports import bind_socket
from tests.support.ledger import read_jsonl
from tests.support.traced_run import ROLLOUTS, ChatUpstream, run_with_traces

BINARY = os.environ.get("ROLLGYM_OTELCOL") or shutil.which("otelcol-contrib")
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        BINARY is None,
        reason="no OpenTelemetry Collector: set ROLLGYM_OTELCOL to an otelcol-contrib binary",
    ),
]

CONFIG = """
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {path}
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
"""


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Until the collector takes an (empty) export request, or ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the collector exited with {proc.returncode}")
        request = urllib.request.Request(
            f"{url}/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError("the collector did not take requests in time")


def spans_of(path: Path) -> list[dict[str, Any]]:
    """Every span of the file exporter's OTLP JSON lines, with its service's name."""
    out = []
    for line in path.read_bytes().splitlines():
        for rs in orjson.loads(line).get("resourceSpans", []):
            attrs = {a["key"]: a["value"] for a in rs["resource"].get("attributes", [])}
            service = attrs.get("service.name", {}).get("stringValue", "")
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    out.append({**span, "service": service})
    return out


def test_a_run_through_a_real_collector(
    tmp_path: Path, upstream_url: tuple[str, ChatUpstream]
) -> None:
    assert BINARY is not None
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # the collector binds it (a short race with other programs: opt-in test)
    exported = tmp_path / "traces.jsonl"
    config = tmp_path / "otelcol.yaml"
    config.write_text(CONFIG.format(port=port, path=exported))
    proc = subprocess.Popen(
        [BINARY, "--config", str(config)], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        done = run_with_traces(tmp_path, upstream_url[0], **env)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)  # the file exporter flushes as the collector stops
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert len(read_jsonl(tmp_path / "out" / "rollouts.jsonl")) == ROLLOUTS
    spans = spans_of(exported)
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        traces[span["traceId"]].append(span)
    assert len(traces) == ROLLOUTS
    for trace in traces.values():
        [root] = [s for s in trace if not s.get("parentSpanId")]
        assert root["name"] == "rollout"
        ids = {s["spanId"] for s in trace}
        assert all(s is root or s["parentSpanId"] in ids for s in trace)
        assert {s["service"] for s in trace} == {
            "rollgym-collector",
            "rollgym-agent",
            "rollgym-model",
            "rollgym-env",
        }
