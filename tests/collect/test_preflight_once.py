"""A run's pre-flight (``check_servers``: every impl imports, every option is valid) runs once
per run, where its launcher is built, before anything is written or started; a ``Supervisor``
built directly still runs it when it starts. The CLI runs in this process (``cli_here``)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollgym.errors import ConfigError
from rollgym.launch import Supervisor
from tests.report.runs import good_run
from tests.support.cli_here import count_checks, rollgym_here
from tests.support.stack import stack_config, stack_data, write_tasks

pytestmark = pytest.mark.timeout(120)

LAUNCHED = {"model", "env", "agent"}


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    return count_checks(monkeypatch)


def write_config(path: Path, **collect: Any) -> Path:
    path.write_text(json.dumps(stack_data({"concurrency": 2, **collect})))  # JSON is YAML
    return path


@pytest.mark.parametrize("agent_in_process", [False, True])
def test_rollgym_run_checks_each_server_once(
    checks: Counter[str], tmp_path: Path, agent_in_process: bool
) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", agent_in_process=agent_in_process)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    code = rollgym_here("run", cfg, "-i", tasks, "-o", tmp_path / "out", "--no-progress")
    assert code == 0
    assert checks == dict.fromkeys(LAUNCHED, 1)


def test_rollgym_reverify_checks_each_server_once(checks: Counter[str], tmp_path: Path) -> None:
    source = asyncio.run(good_run(tmp_path, n=3, repeats=2))
    checks.clear()  # the source run was collected against running servers: nothing checked
    cfg = write_config(tmp_path / "cfg.yaml")
    out = tmp_path / "reverified"
    code = rollgym_here("reverify", source, "--config", cfg, "-o", out, "--no-progress")
    assert code == 0
    assert checks == dict.fromkeys(LAUNCHED, 1)


def test_a_bad_option_fails_run_and_reverify_before_anything_is_written(tmp_path: Path) -> None:
    source = asyncio.run(good_run(tmp_path, n=2, repeats=1))
    data = stack_data(env={"options": {"no_such_option": 1}})
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(data))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    for args in (
        ("run", cfg, "-i", tasks, "-o", tmp_path / "out", "--no-progress"),
        ("reverify", source, "--config", cfg, "-o", tmp_path / "out", "--no-progress"),
    ):
        with pytest.raises(ConfigError, match=r"servers\.env\.options\.no_such_option"):
            rollgym_here(*args)
        assert not (tmp_path / "out").exists(), args[0]


async def test_a_supervisor_built_directly_still_checks_its_config(tmp_path: Path) -> None:
    bad = stack_config(env={"impl": "no_such_module_xyz:Env"})
    supervisor = Supervisor(bad, log_dir=tmp_path / "logs")
    try:
        with pytest.raises(ConfigError, match=r"servers\.env\.impl"):
            await supervisor.start()
        assert supervisor.servers == []  # nothing started
    finally:
        await supervisor.stop()
