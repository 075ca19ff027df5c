"""The process group under both launchers: one deadline, named failures, clean stops."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rollgym.config import parse_config
from rollgym.errors import LaunchError
from rollgym.http import LeanTransport
from rollgym.launch import ProcessGroup, ServerSpec, Supervisor
from rollgym.launch.health import probe
from tests.support.procs import still_alive

pytestmark = pytest.mark.timeout(60)


def servers_config(**servers: str) -> dict[str, object]:
    """A config's JSON form with one resources server per ``name=impl``."""
    cfg = parse_config(
        {"servers": {n: {"kind": "resources", "impl": impl} for n, impl in servers.items()}},
        "test-config",
    )
    return cfg.model_dump(mode="json")


def file_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_server_never_healthy_is_named_with_its_log_and_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    config = servers_config(env="tests.launch.crashing:HangOnStart", ok="echo")
    # A deadline and a grace that a busy machine meets: "ok" must be up, "env" must have
    # logged, and "ok" must stop on SIGTERM, each well within them.
    group = ProcessGroup(config, log_dir=tmp_path, stop_grace=5.0)
    specs = [ServerSpec("env"), ServerSpec("ok")]
    with pytest.raises(LaunchError) as info:
        await group.start(specs, {}, timeout=15)
    err = info.value
    assert err.server == "env"
    assert "server env not healthy after 15s" in err.message
    assert "ok" not in err.message.split("still waiting for:")[1].split(";")[0]  # ok was up
    assert "warming the many-worlds cache" in err.message  # its log's last lines
    env, ok = group.servers
    assert env.proc is not None and ok.proc is not None
    assert env.proc.returncode == -signal.SIGKILL  # SIGTERM ignored: killed after the grace
    assert ok.proc.returncode in (0, -signal.SIGTERM)  # stopped by SIGTERM, in time
    await group.stop()  # again: nothing left to do, no error


async def test_stop_before_spawning_closes_the_bound_sockets() -> None:
    group = ProcessGroup(servers_config(env="echo"))
    server = group.bind(ServerSpec("env"))
    assert server.sock is not None
    await group.stop()
    assert server.sock is None and server.proc is None
    assert ((await probe(LeanTransport(), server.url)).problem or "").startswith("cannot connect")


async def test_replicas_get_their_own_urls_and_logs(tmp_path: Path) -> None:
    cfg = parse_config(
        {"servers": {"env": {"kind": "resources", "impl": "echo", "replicas": 2}}}, "cfg"
    )
    supervisor = Supervisor(cfg, log_dir=tmp_path, startup_timeout=30)
    try:
        urls = await supervisor.start()
        assert len(set(urls["env"])) == 2
        transport = LeanTransport()
        assert [(await probe(transport, url)).problem for url in urls["env"]] == [None, None]
        await transport.close()
    finally:
        await supervisor.stop()
    assert file_names(tmp_path) == ["env.0.log", "env.1.log"]


async def test_a_killed_server_restarts_on_the_same_url(tmp_path: Path) -> None:
    cfg = parse_config({"servers": {"env": {"kind": "resources", "impl": "echo"}}}, "cfg")
    supervisor = Supervisor(cfg, log_dir=tmp_path, startup_timeout=30)
    try:
        (url,) = (await supervisor.start())["env"]
        (first,) = supervisor.pids()
        supervisor.kill("env")
        transport = LeanTransport()
        assert ((await probe(transport, url)).problem or "").startswith("cannot connect")
        await supervisor.restart("env")
        assert (await probe(transport, url)).problem is None
        await transport.close()
        (second,) = supervisor.pids()
        assert second != first
    finally:
        await supervisor.stop()
        await supervisor.stop()  # idempotent
    assert still_alive([first, second], timeout=1) == []
