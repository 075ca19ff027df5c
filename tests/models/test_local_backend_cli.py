"""``rollgym serve-model`` as a user runs it: a real process serving a tiny model, its URL
written once it listens, a weight push through ``LocalModelWeights``, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollgym.integrations.weights import LocalModelWeights
from rollgym.models.tiny import build_tiny_model
from rollgym.wire import POLICY_VERSION

pytestmark = pytest.mark.timeout(120)

STARTUP_S = 90.0


def test_serve_model_serves_pushes_and_stops(tmp_path: Path) -> None:
    import urllib.request

    import orjson

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    newer = build_tiny_model(tmp_path / "newer", seed=1)
    url_file = tmp_path / "url"
    rollgym = Path(sys.executable).with_name("rollgym")
    proc = subprocess.Popen(
        [str(rollgym), "serve-model", str(model), "--write-url", str(url_file), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_S
        while not url_file.exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "serve-model did not start"
            time.sleep(0.1)
        url = url_file.read_text().strip()
        with urllib.request.urlopen(url + "/health", timeout=10) as answer:
            health = orjson.loads(answer.read())
        assert health["status"] == "ok" and health[POLICY_VERSION] == 0
        sync = LocalModelWeights(url, timeout=30)
        assert sync.push_sync(newer, 5).version == 5
        body = orjson.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 1}
        )
        request = urllib.request.Request(
            url + "/v1/chat/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert orjson.loads(answer.read())[POLICY_VERSION] == 5
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    # uvicorn shuts down gracefully, then re-raises the signal it caught (its exit status).
    assert proc.returncode in (0, -signal.SIGTERM)
    assert b"tests and debugging" in (proc.stdout.read() if proc.stdout else b"")
