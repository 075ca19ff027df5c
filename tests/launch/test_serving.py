"""``rollgym.serve_config``: a config's servers started from Python, sync and async, stopped on
the way out whatever happens in the block."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import rollgym
from rollgym.errors import ConfigError, LaunchError
from tests.support.procs import still_alive

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
LOOKUP = ROOT / "src/rollgym/envs/lookup/config.yaml"


def _workers() -> list[int]:
    """This process's server processes (the launcher's workers are its children)."""
    return [
        p.pid
        for p in psutil.Process().children(recursive=True)
        if "rollgym.cli.worker" in " ".join(p.cmdline())
    ]


def test_sync_servers_answer_a_batch_and_stop_on_exit() -> None:
    with rollgym.serve_config(LOOKUP) as servers:
        pids = _workers()
        assert sorted(servers.urls) == ["agent", "lookup", "model"] and len(pids) == 3
        assert servers.agent == "agent"
        rows = servers.rows(limit=3)
        groups = servers.client.collect_sync(rows, repeats=2)
        assert [g.task_index for g in groups] == [0, 1, 2]
        assert all(len(g.rollouts) == 2 and g.complete for g in groups)
        assert {r for g in groups for r in g.rewards} <= {0.0, 1.0}
    assert still_alive(pids) == []
    assert _workers() == []


async def test_async_servers_from_a_dict_stop_when_the_block_raises() -> None:
    config = {
        "servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "env": {"kind": "resources", "impl": "lookup"},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "model", "resources": "env"},
            },
        },
    }
    with pytest.raises(RuntimeError, match="training step failed"):
        async with rollgym.serve_config(config) as servers:
            pids = _workers()
            assert len(pids) == 3
            with pytest.raises(ConfigError, match=r"collect\.input"):
                servers.rows()  # this config names no task file
            raise RuntimeError("training step failed")
    assert still_alive(pids) == []


def test_a_config_without_an_agent_fails_before_anything_starts() -> None:
    config = {"servers": {"model": {"kind": "model", "impl": "scripted"}}}
    with pytest.raises(ConfigError, match="agent"):
        rollgym.serve_config(config)
    assert _workers() == []


def test_a_server_that_cannot_start_leaves_nothing_running() -> None:
    config = {
        "servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "env": {"kind": "resources", "impl": "tests.launch.crashing:CrashOnStart"},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "model", "resources": "env"},
            },
        },
    }
    with pytest.raises(LaunchError, match="env"), rollgym.serve_config(config, startup_timeout=30):
        pass
    assert _workers() == []  # the healthy ones were stopped too


def test_a_manager_is_entered_once() -> None:
    manager = rollgym.serve_config(LOOKUP)
    with manager, pytest.raises(RuntimeError, match="entered once"), manager:
        pass


def test_import_rollgym_stays_light() -> None:
    """The CLI and every server process import the package: the trainer API loads on first
    use of its names, not before."""
    code = (
        "import sys, rollgym\n"
        "assert 'rollgym.trainer' not in sys.modules and 'rollgym.serving' not in sys.modules\n"
        "from rollgym import serve_config, RolloutClient, TaskGroup\n"
        "import rollgym.serving, rollgym.trainer\n"
        "assert serve_config is rollgym.serving.serve_config\n"
        "assert RolloutClient is rollgym.trainer.RolloutClient\n"
        "assert sorted(rollgym.__all__) == sorted(set(rollgym.__all__))\n"
        "for name in rollgym.__all__: getattr(rollgym, name)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
