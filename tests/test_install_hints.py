"""Every "install the extra" hint, read back from the terminal: each command that needs an extra
is run where that extra's packages cannot be imported (a ``sitecustomize`` puts None in
``sys.modules`` for them, in the command and in every server process it starts), and must print
the exact ``pip install 'rollgym[EXTRA]'``, with no traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from rollgym.extras import EXTRA_OF_MODULE, NEEDED_BY, install_command

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
LOOKUP = REPO / "src/rollgym/envs/lookup/config.yaml"
# Extras no command needs: the tools of this repository.
NOT_FOR_COMMANDS = {"dev", "docs"}

BLOCKER = """\
import os, sys
# The test's stand-in for an extra that is not installed: importing these modules fails.
for name in filter(None, os.environ.get("ROLLGYM_TEST_BLOCK", "").split(",")):
    sys.modules[name] = None
"""


def blocked_env(tmp_path: Path, extra: str) -> dict[str, str]:
    """The environment of a process (and its children) where ``extra``'s modules are missing."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    modules = [m for m, e in EXTRA_OF_MODULE.items() if e == extra]
    path = os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # 80 columns: a person's terminal; the hint must not be cut or wrapped away there.
    return {**env, "PYTHONPATH": path, "ROLLGYM_TEST_BLOCK": ",".join(modules), "COLUMNS": "80"}


def local_model_config(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    config = yaml.safe_load(LOOKUP.read_text())
    config["servers"]["model"] = {
        "kind": "model",
        "impl": "rollgym.models.local:LocalModel",
        "options": {"model_dir": str(tmp_path / "model")},
    }
    config["collect"]["input"] = str(LOOKUP.parent / config["collect"]["input"])
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def openenv_config(tmp_path: Path) -> Path:
    # examples/mixed's OpenEnv environment: reverse_env.py imports openenv-core.
    shutil.copy(REPO / "examples/mixed/reverse_env.py", tmp_path)
    config = {
        "servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "reverse": {
                "kind": "resources",
                "impl": "openenv",
                "options": {"app": "reverse_env:app"},
            },
            "agent": {
                "kind": "agent",
                "impl": "openenv_agent",
                "options": {"model": "model", "resources": "reverse"},
            },
        },
        "collect": {"input": str(REPO / "examples/mixed/tasks.jsonl")},
    }
    path = tmp_path / "openenv.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


RUN = ["run", str(LOOKUP), "--limit", "1", "--no-progress", "-o", "{tmp}/out"]
RG_CONFIG = str(REPO / "src/rollgym/envs/reasoning_gym/config.yaml")
RG_TASKS = ["tasks", "reasoning-gym", "--dataset", "leg_counting", "--size", "2", "--output", "t"]
RUN_MADE = ["run", "{config}", "--limit", "1", "--no-progress", "-o", "{tmp}/out"]
# (extra, the command that needs it: "{tmp}" is the test's directory and "{config}" the config
# the builder makes there, extra environment variables)
CASES = [
    ("metrics", [*RUN, "--metrics-port", "0"], None, {}),
    ("ray", [*RUN, "--ray"], None, {}),
    ("trace", RUN, None, {"OTEL_TRACES_EXPORTER": "otlp"}),
    ("reasoning-gym", RG_TASKS, None, {}),
    ("reasoning-gym", ["run", RG_CONFIG, *RUN[2:]], None, {}),
    ("openenv", ["serve-openenv", str(LOOKUP), "--env", "lookup"], None, {}),
    ("openenv", RUN_MADE, openenv_config, {}),
    ("train", ["serve-model", "{tmp}"], None, {}),
    ("train", RUN_MADE, local_model_config, {}),
]


@pytest.mark.parametrize(
    ("extra", "args", "make_config", "extra_env"),
    CASES,
    ids=[f"{c[0]}:{c[1][0]}{'-' + c[2].__name__ if c[2] else ''}" for c in CASES],
)
def test_a_command_without_its_extra_prints_the_command_that_installs_it(
    tmp_path: Path, extra: str, args: list[str], make_config: object, extra_env: dict[str, str]
) -> None:
    config = make_config(tmp_path) if callable(make_config) else None
    argv = [a.format(tmp=tmp_path, config=config) for a in args]
    done = subprocess.run(
        [ROLLGYM, *argv], env={**blocked_env(tmp_path, extra), **extra_env}, cwd=tmp_path,
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    terminal = done.stdout + done.stderr
    assert done.returncode == 2, terminal
    assert install_command(extra) in terminal, terminal
    assert "Traceback" not in terminal, terminal


def test_the_top_level_help_names_every_extra_whole() -> None:
    done = subprocess.run(
        [ROLLGYM, "--help"], env={**os.environ, "COLUMNS": "80"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in set(extras) - NOT_FOR_COMMANDS:
        # On one line: a person copies it from there.
        assert any(install_command(extra) in line for line in done.stdout.splitlines()), extra
    assert set(NEEDED_BY) == set(extras) - NOT_FOR_COMMANDS
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)


@pytest.mark.parametrize(("command", "extra"), [("run", "ray"), ("serve-openenv", "openenv")])
def test_a_command_help_names_its_extra_whole(command: str, extra: str) -> None:
    done = subprocess.run(
        [ROLLGYM, command, "--help"], env={**os.environ, "COLUMNS": "80"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert install_command(extra) in " ".join(done.stdout.split()), done.stdout
