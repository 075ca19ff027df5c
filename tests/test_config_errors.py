"""Config mistakes a person can act on (the file, the key, the near match), ``impl:`` modules
found beside the config, and the run directory's lock, state and history."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from rollgym.collect import mark_failed_to_start, prepare_run
from rollgym.collect.rundir import DIED, read_state, recorded_inputs
from rollgym.config import Config, load_config, parse_config
from rollgym.errors import ConfigError, LaunchError
from rollgym.server.base import check_servers, resolve_impl
from tests.support.stack import stack_config, stack_data, write_tasks

pytestmark = pytest.mark.timeout(30)


# -- config keys and YAML ----------------------------------------------------------------------


def test_unknown_keys_name_the_nearest_known_key(tmp_path: Path) -> None:
    data = copy.deepcopy(stack_data())
    data["servers"]["model"]["replica"] = 2
    data["servers"]["env"]["retry"] = {"max_atempts": 2}
    data["servers"]["env"]["chaos"] = {"fautls": []}
    data["collect"]["concurency"] = 3
    data["servr"] = 1
    data["collect"]["zzz"] = 1
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.yaml")
    lines = str(info.value).splitlines()
    assert lines[0] == "cfg.yaml: invalid config"
    assert set(map(str.strip, lines[1:])) == {
        "servers.model.replica: unknown key (did you mean replicas?)",
        "servers.env.retry.max_atempts: unknown key (did you mean max_attempts?)",
        "servers.env.chaos.fautls: unknown key (did you mean faults?)",
        "collect.concurency: unknown key (did you mean concurrency?)",
        "servr: unknown key (did you mean servers?)",
        "collect.zzz: unknown key (known keys: agent, agent_aliases, agent_in_process, budget, "
        "concurrency, config_error_window, ignore_agent_ref, input, limit, mask_exploits, "
        "max_failure_rate, max_failures, max_rollout_attempts, min_failure_samples, "
        "pass_threshold, prices, repeats, retry_in_run, rollout_timeout, taskset_routes)",
    }


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("servers:\n  model: {kind: model\n  env: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    message = str(info.value)
    assert message.startswith(f"{cfg}:3:6: not valid YAML: expected ',' or '}}'")
    assert "(while parsing a flow mapping at line 2, column 10)" in message
    assert "<unicode string>" not in message


# -- impl: module:Class ----------------------------------------------------------------------

WEATHER = """
from rollgym.envs.echo.server import EchoEnv


class Weather(EchoEnv):
    pass
"""


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """resolve_impl extends sys.path and imports modules: undo both after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _project(tmp_path: Path, module: str, impl: str, source: str = WEATHER) -> Path:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / f"{module}.py").write_text(source)
    cfg = project / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(stack_data(env={"impl": impl})))
    return cfg


@pytest.mark.usefixtures("clean_imports")
def test_an_impl_beside_the_config_resolves_there_and_in_a_server_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_path = _project(tmp_path, "weather_beside", "weather_beside:Weather")
    monkeypatch.chdir(tmp_path)
    config = load_config("project/cfg.yaml")
    check_servers(config)  # the parent, before anything starts
    # A server process gets the config as run.json holds it, from the same working directory.
    in_worker = Config.model_validate(config.model_dump(mode="json"))
    klass = resolve_impl("weather_beside:Weather", "resources", config_dir=in_worker.base_dir())
    assert klass.__name__ == "Weather"
    assert (
        Path(sys.modules["weather_beside"].__file__ or "") == cfg_path.parent / "weather_beside.py"
    )
    # Searched after the installed packages: a file beside the config shadows nothing.
    assert sys.path[-1] == str(cfg_path.parent)


@pytest.mark.usefixtures("clean_imports")
def test_an_impl_that_does_not_resolve_names_the_file_key_and_remedy(tmp_path: Path) -> None:
    broken = "import no_such_dependency_xyz\n"
    cases = [
        ("nowhere_xyz:Weather", "no module named 'nowhere_xyz' among the installed packages"),
        ("weather_typo:Wether", "weather_typo.py has no 'Wether' (did you mean Weather?)"),
        ("tool_agnt", "'tool_agnt' is not a built-in server"),
        ("broken_dep:Weather", "importing broken_dep failed: No module named "),
    ]
    _project(tmp_path, "weather_typo", "x:Y")
    _project(tmp_path, "broken_dep", "x:Y", source=broken)
    for impl, message in cases:
        data = stack_data(env={"impl": impl})
        cfg = tmp_path / "project" / "cfg.yaml"
        cfg.write_text(yaml.safe_dump(data))
        config = load_config(cfg)
        with pytest.raises(ConfigError) as info:
            check_servers(config)
        text = str(info.value)
        assert text.startswith(f"{cfg}: servers.env.impl: '{impl}'"), text
        assert message in text, text
    assert "did you mean tool_agent?" in _error_of("tool_agnt")
    assert f"beside the config ({tmp_path / 'project'})" in _error_of(
        "nowhere_xyz:Weather", tmp_path / "project"
    )


def _error_of(impl: str, config_dir: Path | None = None) -> str:
    try:
        resolve_impl(impl, config_dir=config_dir)
    except ConfigError as err:
        return str(err)
    raise AssertionError(f"{impl} resolved")


# -- the run directory -------------------------------------------------------------------------


def test_a_locked_run_is_alive_and_refused_and_an_unlocked_running_one_died(
    tmp_path: Path,
) -> None:
    cfg = stack_config()
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out"
    live = prepare_run(cfg, cfg.collect, tasks, out, resume=False, lock=True)
    state = read_state(out)
    assert state is not None and state.alive and state.pid == os.getpid()
    for resume in (True, False):
        with pytest.raises(ConfigError, match=r"a run is still collecting into it \(pid \d+ on "):
            prepare_run(cfg, cfg.collect, tasks, out, resume=resume, lock=True)
    live.release()  # what the kernel does when the process dies
    state = read_state(out)
    assert state is not None and state.status == DIED and not state.alive

    again = prepare_run(cfg, cfg.collect, tasks, out, resume=True, lock=True)
    try:
        run = orjson.loads((out / "run.json").read_bytes())
        assert run["status"] == "running" and [h["status"] for h in run["history"]] == [DIED]
    finally:
        again.release()


def test_resume_moves_the_last_session_to_history(tmp_path: Path) -> None:
    cfg = stack_config({"repeats": 2, "limit": 2})
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out"
    first = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    mark_failed_to_start(first, LaunchError("server agent exited with code 3", server="agent"))
    recorded = recorded_inputs(out)
    assert recorded is not None and (recorded.repeats, recorded.limit) == (2, 2)
    assert recorded.input == tasks.absolute()
    prepare_run(cfg, cfg.collect, tasks, out, resume=True)
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "running" and "error" not in run and "exit_code" not in run
    [earlier] = run["history"]
    assert earlier["status"] == "failed_to_start" and earlier["exit_code"] == 2
    assert earlier["error"]["message"] == "server agent exited with code 3"
