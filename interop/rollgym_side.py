"""rollgym's side of the interop suite, through its CLI (real processes, as a user runs it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

from interop.nemo import ROLLGYM_VENV, kill_pids

ROLLGYM = str(ROLLGYM_VENV / "bin" / "rollgym")


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def rollgym_serve(config_path: Path, *, timeout: float = 60.0) -> Iterator[dict[str, list[str]]]:
    """``rollgym serve CONFIG --write-urls``; yield name -> URLs; stop every process by PID."""
    urls_file = config_path.with_suffix(".urls.json")
    urls_file.unlink(missing_ok=True)
    log = config_path.with_suffix(".serve.log")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [ROLLGYM, "serve", str(config_path), "--write-urls", str(urls_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while not urls_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rollgym serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written whole after the servers are healthy
        yield json.loads(urls_file.read_text())
    finally:
        children = _tree(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        kill_pids(children)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


TIMED_OUT = 124
"""``rollgym_run``'s exit code for a run stopped at its timeout (as timeout(1) says)."""


def rollgym_run(config_path: Path, out: Path, *extra: str, timeout: float = 300.0) -> int:
    """``rollgym run CONFIG --output OUT``; its exit code (its log is ``OUT.log``)."""
    log = out.with_suffix(".log")
    with log.open("wb") as sink:
        try:
            proc = subprocess.run(
                [ROLLGYM, "run", str(config_path), "--output", str(out), *extra],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                env={**os.environ, "NO_COLOR": "1"},
            )
        except subprocess.TimeoutExpired:
            # subprocess.run killed it; its servers end with it (rollgym's lifeline). What it
            # recorded is kept: the caller reads failures.jsonl for the cause.
            sink.write(b"\n[interop] rollgym run stopped after %d s\n" % int(timeout))
            return TIMED_OUT
    return proc.returncode


def url_server(kind: str, url: str) -> dict[str, Any]:
    return {"kind": kind, "url": url}


def tool_agent_config(
    model_url: str, resources_url: str, *, impl: str = "tool_agent", **collect: Any
) -> dict[str, Any]:
    """rollgym's agent (launched by rollgym) against a model and resources server given by URL."""
    return {
        "servers": {
            "model": url_server("model", model_url),
            "env": url_server("resources", resources_url),
            "agent": {
                "kind": "agent",
                "impl": impl,
                "options": {"model": "model", "resources": "env"},
            },
        },
        "collect": {"agent": "agent", "concurrency": 4, "rollout_timeout": 120, **collect},
    }
