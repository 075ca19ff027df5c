"""Reading Harbor task directories: the bundled tasks load, and every mistake names its file
and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rollgym.errors import ConfigError
from rollgym.harbor.runconfig import harbor_config
from rollgym.harbor.task import load_task, load_tasks
from rollgym.harbor.trial import task_limits

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "harbor-tasks"


def test_bundled_tasks_load_as_rows() -> None:
    tasks = load_tasks(BUNDLED)
    assert len(tasks) >= 10
    for task in tasks:
        row = task.row()
        assert row["responses_create_params"]["input"] == task.instruction
        assert row["harbor"] == {"task": task.name}  # no path to tests or solution
        assert task.solution.is_file() and task.test_script.is_file()
        assert not task_limits(task).network


def _task(tmp_path: Path, toml: str) -> Path:
    d = tmp_path / "t"
    shutil.copytree(BUNDLED / "hello-file", d)
    (d / "task.toml").write_text(toml)
    return d


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[verifier]\ntimeout_sec = -1\n", "verifier.timeout_sec"),
        ("[environment]\ngpus = 1\n", "environment.gpus"),
        ("[environment]\nnetwork_mode = 'allowlist'\n", "environment.network_mode"),
        ("[[steps]]\nname = 'a'\n", "steps"),
        ("[environment]\ncpus = 'two'\n", "environment.cpus"),
        ("[verifier\n", "not valid TOML"),
        ("[metadata]\nrollgym_keep_system_change = true\n", "unknown rollgym key"),
        ("[metadata]\nrollgym_keep_system_changes = 'yes'\n", "must be true or false"),
    ],
)
def test_bad_task_toml_names_file_and_key(tmp_path: Path, toml: str, said: str) -> None:
    d = _task(tmp_path, toml)
    with pytest.raises(ConfigError) as err:
        load_task(d)
    assert str(d / "task.toml") in str(err.value) and said in str(err.value)


def test_network_only_when_the_task_says(tmp_path: Path) -> None:
    on = load_task(_task(tmp_path, "[environment]\nnetwork_mode = 'public'\n"))
    assert task_limits(on).network
    (tmp_path / "t" / "task.toml").write_text("[environment]\nallow_internet = true\ncpus = 2\n")
    legacy = load_task(tmp_path / "t")
    assert task_limits(legacy).network and task_limits(legacy).cpus == 2


@pytest.mark.parametrize("missing", ["instruction.md", "environment/Dockerfile", "tests/test.sh"])
def test_missing_file_is_named(tmp_path: Path, missing: str) -> None:
    d = _task(tmp_path, "")
    (d / missing).unlink()
    with pytest.raises(ConfigError, match=str(d / missing)):
        load_task(d)


def test_a_directory_without_tasks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no Harbor task"):
        load_tasks(tmp_path)


def test_run_config_needs_a_model_for_the_terminal_agent() -> None:
    with pytest.raises(ConfigError, match="--model-url"):
        harbor_config(BUNDLED, "terminal")
    with pytest.raises(ConfigError, match="oracle, nop, terminal"):
        harbor_config(BUNDLED, "claude-code")
    cfg = harbor_config(BUNDLED, "terminal", model_url="http://127.0.0.1:9/v1")
    assert cfg["servers"]["model"]["options"]["base_url"] == "http://127.0.0.1:9/v1"
    assert set(cfg["servers"]) == {"tasks", "terminal", "model"}


def test_instruction_loses_its_canary_lines_as_in_harbor(tmp_path: Path) -> None:
    d = _task(tmp_path, "[environment]\nmemory = '1G'\nstorage = '512M'\n")
    (d / "instruction.md").write_text(
        "<!-- BENCHMARK DATA canary GUID 1234 -->\n# canary 2\n\nDo it.\n"
    )
    task = load_task(d)
    assert task.instruction == "Do it.\n"
    assert (task.config.environment.memory_mb, task.config.environment.storage_mb) == (1024, 512)


def test_a_newer_task_toml_loads(tmp_path: Path) -> None:
    # Keys of Harbor's later schema: [task] with authors, artifacts, gpus = 0, network_mode.
    d = _task(
        tmp_path,
        'schema_version = "2.0"\nartifacts = []\n\n[task]\nname = "org/hello"\n'
        'authors = [{ name = "A", email = "a@example.com" }]\n\n[environment]\ngpus = 0\n'
        'network_mode = "public"\ncpus = 1\nmemory_mb = 1024\n',
    )
    task = load_task(d)
    assert task.name == "t" and task_limits(task).network and task_limits(task).memory_mb == 1024


def test_the_keep_system_changes_key_is_read_and_other_metadata_is_left_alone(
    tmp_path: Path,
) -> None:
    toml = "[metadata]\nrollgym_keep_system_changes = true\nauthor = 'x'\n"
    assert load_task(_task(tmp_path, toml)).keep_system_changes
    assert not load_task(BUNDLED / "hello-file").keep_system_changes
