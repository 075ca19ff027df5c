"""The agent in the collector's process (``--agent-in-process``): the same records as the
served agent, one process fewer, and its transport answers as a socket would (timeouts, refused,
cookies, error bodies). The command-line runs start real server processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.responses import Response
from starlette.routing import Route

from rollgym.errors import (
    ConfigError,
    ConnectError,
    DeadlineExceeded,
    HTTPStatusError,
    ReadTimeout,
)
from rollgym.http import HttpClient, LeanTransport, Target
from rollgym.http.inprocess import InProcessTransport, inprocess_url
from rollgym.server.app import App
from rollgym.server.base import BaseServer
from tests.support.ledger import read_jsonl
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
LOOKUP = REPO / "src" / "rollgym" / "envs" / "lookup" / "config.yaml"


def rollgym(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)], capture_output=True, text=True, timeout=90,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip


def records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["task_index"], r["rollout_index"]): r for r in read_jsonl(out / "rollouts.jsonl")}


def test_the_same_records_with_one_process_fewer(tmp_path: Path) -> None:
    served = rollgym("run", LOOKUP, "--output", tmp_path / "served", "--no-progress")
    inline = rollgym(
        "run", LOOKUP, "--output", tmp_path / "inline", "--no-progress", "--agent-in-process"
    )
    assert served.returncode == 0, served.stderr
    assert inline.returncode == 0, inline.stderr
    a, b = records(tmp_path / "served"), records(tmp_path / "inline")
    assert a.keys() == b.keys() and len(a) > 50
    assert {k: r["reward"] for k, r in a.items()} == {k: r["reward"] for k, r in b.items()}
    # The same record shape, the agent's per-hop timing included.
    assert all(set(a[k]) == set(b[k]) for k in a)
    assert all(b[k]["rollgym_timing"]["model"] for k in b)
    # No agent process: its log is the proof that one ran.
    assert (tmp_path / "served" / "logs" / "agent.log").exists()
    assert not (tmp_path / "inline" / "logs" / "agent.log").exists()
    metrics = orjson.loads((tmp_path / "inline" / "metrics.json").read_bytes())
    assert metrics["agents_in_process"] == ["agent"]
    assert "agents_in_process" not in orjson.loads(
        (tmp_path / "served" / "metrics.json").read_bytes()
    )


def test_not_with_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from rollgym.collect import RunningServers, run_collection
    from rollgym.collect.rollout import RolloutPolicy
    from rollgym.ray import RayDispatcher
    from tests.support.stack import stack_config, write_tasks

    cfg = stack_config({"agent_in_process": True})
    dispatcher = RayDispatcher(RolloutPolicy.from_collect(cfg.collect), 2, workers=1)
    run = run_collection(
        cfg, cfg.collect, write_tasks(tmp_path / "t.jsonl", 2), tmp_path / "out",
        RunningServers({}), dispatcher=dispatcher, progress=False,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="agent_in_process"):
        asyncio.run(run)
    assert not (tmp_path / "out" / "run.json").exists()  # refused before anything is written


# -- the transport -----------------------------------------------------------------------------


class Slow(BaseServer):
    """Answers /slow after a second, /cookie with a cookie, /boom with a crash."""

    kind = "resources"

    def routes(self) -> list[Route]:
        async def slow(request: Any) -> Response:
            await asyncio.sleep(1.0)
            return Response(b"{}", media_type="application/json")

        async def cookie(request: Any) -> Response:
            response = Response(b'{"ok": true}', media_type="application/json")
            response.set_cookie("session", "abc123")
            return response

        async def boom(request: Any) -> Response:
            raise RuntimeError("kaput")

        return [
            Route("/slow", slow, methods=["POST"]),
            Route("/cookie", cookie, methods=["POST"]),
            Route("/boom", boom, methods=["POST"]),
        ]


@pytest.fixture
def client() -> Any:
    from rollgym.config import ServerConfig
    from rollgym.server.base import ServerContext

    server = Slow(ServerContext("slow", ServerConfig(kind="resources", impl="x")))
    transport = InProcessTransport({"slow": App(server, server.routes())}, LeanTransport())
    return HttpClient(transport=transport)


def target(name: str = "slow", **policy: Any) -> Target:
    retry = fast_policy(max_attempts=1, **policy)
    return Target.single(name, inprocess_url(name), retry)


async def test_a_deadline_ends_the_call_as_over_a_socket(client: HttpClient) -> None:
    with pytest.raises(DeadlineExceeded, match="did not answer within") as caught:
        await client.call(target(), "/slow", {}, deadline=0.2)
    assert isinstance(caught.value.origin, ReadTimeout)


async def test_an_unknown_server_is_refused_like_a_closed_port(client: HttpClient) -> None:
    with pytest.raises(ConnectError, match="no server 'nobody'"):
        await client.call(target("nobody"), "/slow", {}, deadline=1.0)


async def test_cookies_and_error_bodies_come_back(client: HttpClient) -> None:
    answer, cookies = await client.call_with_cookies(target(), "/cookie", {}, deadline=1.0)
    assert answer == {"ok": True} and dict(cookies)["session"] == "abc123"
    with pytest.raises(HTTPStatusError) as caught:
        await client.call(target(), "/boom", {}, deadline=1.0)
    # The server's uniform error body, read as it is from a socket: status, type, message.
    assert caught.value.status == 500
    assert caught.value.root().type == "internal_error" and "kaput" in str(caught.value.root())
