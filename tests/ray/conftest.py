"""A local two-node Ray cluster (started once for the Ray tests), and the stacks they run.

This directory has no ``__init__.py`` on purpose: as a package it could shadow ``ray`` itself.
Helpers are fixtures for the same reason (test modules here cannot import each other).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from rollgym.config import Config, parse_config  # noqa: E402

FAST_RETRY: dict[str, Any] = {
    "backoff_initial": 0.01,
    "backoff_max": 0.02,
    "budget": {"enabled": False},
    "breaker": {"enabled": False},
}
NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    """Two Ray nodes on this machine; the test process is the driver."""
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        # Ray records the head's address here and a later ``ray.init()`` would try to join it.
        recorded = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")
        with contextlib.suppress(OSError):
            if recorded.read_text().strip() == cluster.address:
                recorded.unlink()


@pytest.fixture(scope="session")
def node_ids(ray_cluster: Cluster) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


# -- a model that is down: 503 on every call ---------------------------------------------------


class _Overloaded(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = orjson.dumps(
            {"error": {"type": "http_status", "message": "overloaded", "status": 503}}
        )
        self.send_response(503)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="session")
def overloaded_model() -> Iterator[str]:
    """A model server (in a thread of this process) that answers every call with 503."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Overloaded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- configs, tasks, outputs -------------------------------------------------------------------


def stack_config(
    *,
    replicas: int = 2,
    env_replicas: int = 1,
    latency: float = 0.0,
    model_url: str | None = None,
    collect: dict[str, Any] | None = None,
) -> Config:
    """Scripted model + echo env + tool agent; ``model_url``: use that model instead."""
    model: dict[str, Any] = {
        "kind": "model",
        "impl": "scripted",
        "options": {"latency": latency},
        "retry": FAST_RETRY,
    }
    if model_url is not None:
        model["url"] = model_url
    else:
        model["replicas"] = replicas
    return parse_config(
        {
            "servers": {
                "model": model,
                "env": {"kind": "resources", "impl": "echo", "replicas": env_replicas},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "replicas": replicas,
                    "options": {"model": "model", "resources": "env"},
                },
            },
            "collect": {"concurrency": 8, "rollout_timeout": 60, **(collect or {})},
        },
        "ray-test-config",
    )


def task_row(i: int) -> dict[str, Any]:
    """Echo the answer, then say it back or not: which one is decided per rollout key by the
    scripted model, so repeats differ but every run gives the same rewards."""
    answer = f"v{i}"
    script = [
        {"call": "echo", "arguments": {"text": answer}},
        {"say": ["The answer is {tool_output}", "I do not know", "Maybe {tool_output}"]},
    ]
    return {
        "responses_create_params": {"input": f"task {i}", "metadata": {"rollgym_script": script}},
        "expected_answer": answer,
    }


def write_tasks(path: Path, n: int) -> Path:
    path.write_bytes(b"".join(orjson.dumps(task_row(i)) + b"\n" for i in range(n)))
    return path


def ledger_keys(out: Path) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """(task, rollout) counts in rollouts.jsonl and failures.jsonl."""

    def keys(name: str) -> Counter[tuple[int, int]]:
        path = out / name
        if not path.exists():
            return Counter()
        lines = path.read_bytes().splitlines()
        return Counter((r["task_index"], r["rollout_index"]) for r in map(orjson.loads, lines) if r)

    return keys("rollouts.jsonl"), keys("failures.jsonl")


def assert_ledger_invariant(out: Path) -> tuple[int, int]:
    """Every rollout of tasks.jsonl has exactly one record; return (succeeded, failed)."""
    tasks = [orjson.loads(line) for line in (out / "tasks.jsonl").read_bytes().splitlines()]
    wanted = {(t["task_index"], t["rollout_index"]) for t in tasks}
    ok, bad = ledger_keys(out)
    assert set(ok) | set(bad) == wanted, "a rollout has no record"
    assert not set(ok) & set(bad), "a rollout is recorded as both success and failure"
    assert all(n == 1 for n in (ok + bad).values()), "a rollout is recorded twice"
    return sum(ok.values()), sum(bad.values())


def wait_until(check: Callable[[], bool], timeout: float) -> Any:
    async def poll() -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, "timed out waiting"
            await asyncio.sleep(0.02)

    return poll()


@pytest.fixture(scope="session")
def stack() -> Any:
    """The helpers above, for the test modules (which cannot import this file)."""

    class Stack:
        config = staticmethod(stack_config)
        write_tasks = staticmethod(write_tasks)
        task_row = staticmethod(task_row)
        invariant = staticmethod(assert_ledger_invariant)
        ledger_keys = staticmethod(ledger_keys)
        wait_until = staticmethod(wait_until)

    return Stack
