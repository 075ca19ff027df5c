"""Small command-line promises: --version, clear errors for a bad chaos URL or a busy port, and
`serve` leaving no stale URL file behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from tests.support.stack import stack_data
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

ROLLGYM = str(Path(sys.executable).parent / "rollgym")
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=30
    )


def test_version_prints_the_version() -> None:
    done = run("--version")
    assert done.returncode == 0
    from rollgym import __version__

    assert done.stdout.strip() == f"rollgym {__version__}"


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "faults.yaml"
    spec.write_text(yaml.safe_dump({"seed": 1, "faults": [{"kind": "status", "status": 503}]}))
    return spec


def test_chaos_refuses_an_upstream_that_is_not_a_url(tmp_path: Path) -> None:
    done = run("chaos", "notaurl", "--spec", _spec(tmp_path))
    assert done.returncode == 2
    assert "UPSTREAM: 'notaurl' is not an http(s) URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_chaos_on_a_busy_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run("chaos", "http://127.0.0.1:9", "--spec", _spec(tmp_path), "--port", port)
    assert done.returncode == 2
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_removes_its_url_file_when_it_stops(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(stack_data()))
    urls_file = tmp_path / "urls.json"
    proc = subprocess.Popen(
        [ROLLGYM, "serve", str(cfg), "--write-urls", str(urls_file)],
        env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(urls_file.exists, 30, "serve to write its URLs")
        assert sorted(orjson.loads(urls_file.read_bytes())) == ["agent", "env", "model"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not urls_file.exists()
