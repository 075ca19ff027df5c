"""The supervisor starts real server processes, wires them together and leaves no orphans."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import orjson
import psutil
import pytest

from rollgym.config import Config
from rollgym.errors import LaunchError
from rollgym.launch import Supervisor
from tests.support.procs import still_alive
from tests.support.stack import stack_config, task_row

pytestmark = pytest.mark.timeout(60)

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def test_start_wires_the_servers_together_and_stop_ends_them(tmp_path: Path) -> None:
    supervisor = Supervisor(stack_config(), log_dir=tmp_path / "logs", startup_timeout=30)
    try:
        urls = await supervisor.start()
        pids = supervisor.pids()
        assert sorted(urls) == ["agent", "env", "model"] and len(pids) == 3
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            for name, (url,) in urls.items():
                async with session.get(url + "/health") as resp:
                    assert (await resp.json())["server"] == name
            # The agent process found the model and env processes through the spec.
            async with session.post(urls["agent"][0] + "/run", json=task_row(3)) as resp:
                body = await resp.json()
        assert resp.status == 200, body
        assert body["reward"] == 1.0
    finally:
        await supervisor.stop()
    assert still_alive(pids, timeout=1) == []
    assert all(p.poll() is not None for p in (s.proc for s in supervisor.servers) if p)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "agent.log",
        "env.log",
        "model.log",
    ]


async def test_a_server_that_crashes_on_startup_is_a_launch_error_with_its_log(
    tmp_path: Path,
) -> None:
    cfg = stack_config(env={"impl": "tests.launch.crashing:CrashOnStart"})
    supervisor = Supervisor(cfg, log_dir=tmp_path / "logs", startup_timeout=30)
    with pytest.raises(LaunchError) as info:
        await supervisor.start()
    message = str(info.value)
    assert "server env exited with code" in message
    assert "many-worlds" in message  # the log tail shows the server's own complaint
    assert info.value.server == "env"
    assert still_alive(supervisor.pids(), timeout=1) == []  # the healthy ones were stopped too


async def test_a_port_in_use_is_a_launch_error_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        supervisor = Supervisor(stack_config(env={"port": port}), startup_timeout=10)
        with pytest.raises(LaunchError, match=rf"server env: cannot listen on 127.0.0.1:{port}"):
            await supervisor.start()
    assert supervisor.pids() == []
    assert all(s.sock is None for s in supervisor.servers)  # no socket left open


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from rollgym.config import parse_config
    from rollgym.launch import Supervisor

    async def main():
        servers = {"model": {"kind": "model", "impl": "scripted"},
                   "env": {"kind": "resources", "impl": "echo"}}
        supervisor = Supervisor(parse_config({"servers": servers}), startup_timeout=30)
        await supervisor.start()
        print(*supervisor.pids(), flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def test_servers_die_with_a_killed_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert parent.stdout is not None
        ready, _, _ = select.select([parent.stdout], [], [], 30)
        assert ready, "the parent did not start its servers"
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)  # no chance to stop its children
        parent.wait(5)
        assert still_alive(pids) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(5)


def test_the_worker_spec_carries_the_whole_config() -> None:
    # What a server process is told (see rollgym.launch.worker) must round-trip the config.
    cfg = stack_config(max_steps=4)
    assert Config.model_validate(orjson.loads(orjson.dumps(cfg.model_dump(mode="json")))) == cfg
