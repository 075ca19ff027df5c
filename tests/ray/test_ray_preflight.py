"""``rollgym run --ray`` checks the config's servers once, before anything is written or
started; ``RayServers`` built directly still checks them when it starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollgym.errors import ConfigError
from rollgym.ray import RayServers, run_on_ray
from tests.support.cli_here import count_checks, rollgym_here
from tests.support.stack import stack_config, stack_data, write_tasks

pytestmark = pytest.mark.timeout(150)

BAD_OPTION = {"options": {"no_such_option": 1}}


def test_rollgym_run_ray_checks_each_server_once(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = count_checks(monkeypatch)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps(stack_data({"repeats": 2}, replicas=1)))  # JSON is YAML
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    code = rollgym_here(
        "run", cfg, "-i", tasks, "-o", tmp_path / "out", "--no-progress",
        "--ray-address", ray_cluster.address,
    )  # fmt: skip
    assert code == 0
    assert checks == {"model": 1, "env": 1, "agent": 1}


async def test_a_bad_option_fails_a_ray_run_before_anything_is_written(
    ray_cluster: Any, tmp_path: Path
) -> None:
    bad = stack_config(env=BAD_OPTION, replicas=1)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    with pytest.raises(ConfigError, match=r"servers\.env\.options\.no_such_option"):
        await run_on_ray(bad, bad.collect, tasks, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


async def test_ray_servers_built_directly_still_check_their_config(
    ray_cluster: Any, tmp_path: Path
) -> None:
    servers = RayServers(stack_config(env=BAD_OPTION, replicas=1), log_dir=tmp_path / "logs")
    with pytest.raises(ConfigError, match=r"servers\.env\.options\.no_such_option"):
        await servers.start()
    assert servers.replicas == [] and servers.describe() == []  # nothing started
