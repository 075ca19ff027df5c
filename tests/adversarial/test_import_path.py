"""Issue 36, item 3: a file in the directory the user runs from, named like a module the run
imports, never replaces the code the config names; ``run.json`` says which file each server's
``impl:`` was loaded from, with its sha256.

Every probe runs the real ``rollgym`` command with the working directory holding the shadow
file, and nothing of the repository on ``PYTHONPATH``: what a user's shell would do.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

import rollgym.envs.echo.server
import rollgym.envs.math.server
import rollgym.models.scripted
from rollgym.collect.rundir import mark_code, prepare_run, recorded_code
from rollgym.config import parse_config
from rollgym.server.base import ServerContext, resolve_impl
from rollgym.server.provenance import LoadedCode
from tests.support.ledger import assert_ledger_invariant
from tests.support.stack import SOME_RIGHT, stack_data, write_tasks

pytestmark = pytest.mark.timeout(180)

ROLLGYM = str(Path(sys.executable).parent / "rollgym")
MATH_CONFIG = Path(rollgym.envs.math.server.__file__).parent / "config.yaml"
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"COLUMNS": "1000"}

HONEST = """\
from rollgym.envs.echo.server import EchoEnv


class Weather(EchoEnv):
    pass
"""
FORGED = """\
from rollgym.envs.echo.server import EchoEnv


class Weather(EchoEnv):
    async def verify(self, session, task, response):
        return 1.0
"""
# math-verify as a file in the working directory: every answer "parses" and "verifies".
FORGED_MATH_VERIFY = """\
class ExprExtractionConfig:
    pass


class LatexExtractionConfig:
    pass


def parse(*args, **kwargs):
    return ["x"]


def verify(*args, **kwargs):
    return True
"""


def rollgym_cmd(
    *args: str | Path, cwd: Path, python_m: bool = False, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rollgym"] if python_m else [ROLLGYM]
    env = ENV if pythonpath is None else ENV | {"PYTHONPATH": pythonpath}
    return subprocess.run(
        [*command, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=150, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def rewards(out: Path) -> dict[tuple[int, int], float]:
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == []
    return {(r["task_index"], r["rollout_index"]): r["reward"] for r in rollouts}


def run_code(out: Path) -> dict[str, Any]:
    code: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())["code"]
    return code


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def user_project(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A config with its environment beside it (``impl: weather:Weather``), its tasks (some
    answered wrong: reward 0), and an empty working directory; (config, tasks, cwd)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "weather.py").write_text(HONEST)
    config = project / "cfg.yaml"
    config.write_text(yaml.safe_dump(stack_data(env={"impl": "weather:Weather"})))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 8, say=SOME_RIGHT)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return config, tasks, cwd


def test_a_file_in_the_working_directory_does_not_replace_the_environment_beside_the_config(
    tmp_path: Path,
) -> None:
    config, tasks, cwd = user_project(tmp_path)
    honest = rollgym_cmd("run", config, "-i", tasks, "-o", tmp_path / "honest", "--no-progress",
                         cwd=cwd)  # fmt: skip
    assert honest.returncode == 0, honest.stderr
    (cwd / "weather.py").write_text(FORGED)  # same module name, a verifier that always pays
    shadowed = rollgym_cmd("run", config, "-i", tasks, "-o", tmp_path / "shadowed",
                           "--no-progress", cwd=cwd)  # fmt: skip
    assert shadowed.returncode == 0, shadowed.stderr
    expected = rewards(tmp_path / "honest")
    assert 0.0 in expected.values()  # a forged verifier would show
    assert rewards(tmp_path / "shadowed") == expected
    beside = (config.parent / "weather.py").resolve()
    code = run_code(tmp_path / "shadowed")
    assert code["env"] == {
        "impl": "weather:Weather", "module": "weather", "file": str(beside),
        "sha256": sha256_of(beside),
    }  # fmt: skip
    scripted = Path(rollgym.models.scripted.__file__).resolve()
    assert code["model"]["file"] == str(scripted)
    assert code["model"]["sha256"] == sha256_of(scripted)
    assert set(code) == {"model", "env", "agent"}


def test_a_file_in_the_working_directory_does_not_replace_a_bundled_verifiers_dependency(
    tmp_path: Path,
) -> None:
    args = ("run", MATH_CONFIG, "--repeats", "1", "--limit", "10", "--no-progress")
    clean = tmp_path / "clean"
    clean.mkdir()
    honest = rollgym_cmd(*args, "-o", tmp_path / "honest", cwd=clean)
    assert honest.returncode == 0, honest.stderr
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "math_verify.py").write_text(FORGED_MATH_VERIFY)
    shadowed = rollgym_cmd(*args, "-o", tmp_path / "shadowed", cwd=cwd)
    assert shadowed.returncode == 0, shadowed.stderr
    expected = rewards(tmp_path / "honest")
    assert 0.0 in expected.values()
    assert rewards(tmp_path / "shadowed") == expected
    server = Path(rollgym.envs.math.server.__file__).resolve()
    code = run_code(tmp_path / "shadowed")["math"]
    assert code == {
        "impl": "math", "module": "rollgym.envs.math.server", "file": str(server),
        "sha256": sha256_of(server),
    }  # fmt: skip


def test_rollgym_check_checks_the_bundled_verifier_not_a_file_in_the_working_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "math_verify.py").write_text(FORGED_MATH_VERIFY)
    done = rollgym_cmd("check", MATH_CONFIG, cwd=tmp_path)
    # The forged math-verify passes every answer, wrong ones too: "verifier discriminates"
    # would fail.
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS verifier discriminates" in done.stdout
    server = Path(rollgym.envs.math.server.__file__).resolve()
    assert str(server) in done.stdout and sha256_of(server) in done.stdout


def test_python_m_rollgym_does_not_import_from_the_working_directory(tmp_path: Path) -> None:
    config, tasks, cwd = user_project(tmp_path)
    # Imported by the collector's own pre-flight (``python -m`` put the working directory
    # first on its sys.path) as much as by the servers.
    (cwd / "weather.py").write_text("raise RuntimeError('the shadow was imported')\n")
    done = rollgym_cmd("run", config, "-i", tasks, "-o", tmp_path / "out", "--no-progress",
                       cwd=cwd, python_m=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the shadow was imported" not in done.stderr
    assert len(rewards(tmp_path / "out")) == 8
    assert run_code(tmp_path / "out")["env"]["file"] == str(
        (config.parent / "weather.py").resolve()
    )


def test_an_empty_pythonpath_element_does_not_put_the_working_directory_on_the_path(
    tmp_path: Path,
) -> None:
    config, tasks, cwd = user_project(tmp_path)
    (cwd / "weather.py").write_text(FORGED)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # What ``export PYTHONPATH=$PYTHONPATH:/x`` leaves when PYTHONPATH was unset: the empty
    # element is the working directory, and ``python -P`` keeps it.
    done = rollgym_cmd("run", config, "-i", tasks, "-o", tmp_path / "out", "--no-progress",
                       cwd=cwd, pythonpath=f":{elsewhere}:")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert 0.0 in rewards(tmp_path / "out").values()  # the forged verifier pays every row
    beside = (config.parent / "weather.py").resolve()
    env = run_code(tmp_path / "out")["env"]
    assert (env["file"], env["sha256"]) == (str(beside), sha256_of(beside))


def test_a_relative_pythonpath_element_is_not_searched(tmp_path: Path) -> None:
    config, tasks, cwd = user_project(tmp_path)
    (cwd / "lib").mkdir()
    (cwd / "lib" / "weather.py").write_text("raise RuntimeError('the shadow was imported')\n")
    done = rollgym_cmd("run", config, "-i", tasks, "-o", tmp_path / "out", "--no-progress",
                       cwd=cwd, python_m=True, pythonpath="lib")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the shadow was imported" not in done.stderr
    assert "PYTHONPATH: 'lib' not searched by server processes" in done.stderr
    assert len(rewards(tmp_path / "out")) == 8
    assert run_code(tmp_path / "out")["env"]["file"] == str(
        (config.parent / "weather.py").resolve()
    )


def test_health_names_the_file_a_server_class_was_loaded_from() -> None:
    config = parse_config(stack_data(), "test-config")
    server = resolve_impl("echo")(ServerContext.from_run("env", config, {}))
    code = server.health()["code"]
    file = Path(rollgym.envs.echo.server.__file__).resolve()
    assert code == {
        "impl": "echo", "module": "rollgym.envs.echo.server", "file": str(file),
        "sha256": sha256_of(file),
    }  # fmt: skip
    assert LoadedCode.from_dict(code) == server.code
    assert LoadedCode.from_dict({"status": "ok"}) is None  # a server that does not say


def test_replicas_running_different_code_are_named_in_run_json(tmp_path: Path) -> None:
    config = parse_config(stack_data(), "test-config")
    run = prepare_run(config, config.collect, write_tasks(tmp_path / "t.jsonl", 1),
                      tmp_path / "out", resume=False)  # fmt: skip
    one = LoadedCode("echo", "rollgym.envs.echo.server", "/a/server.py", "1" * 64)
    other = LoadedCode("echo", "rollgym.envs.echo.server", "/b/server.py", "2" * 64)
    mark_code(run, {"env": [one, one, other], "model": [None]})
    assert recorded_code(tmp_path / "out") == {"env": one, "model": None}
    info = orjson.loads((tmp_path / "out" / "run.json").read_bytes())
    [warning] = info["warnings"]
    assert "server env: replica 2 runs other code than replica 0" in warning
    assert "/b/server.py sha256 222222222222" in warning
