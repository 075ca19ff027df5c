"""``rollgym check`` on every bundled environment, and on environments it must fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from rollgym.check import check_env
from rollgym.config import load_config
from rollgym.envs.echo.server import EchoEnv
from rollgym.protocol import output_text
from rollgym.server.resources import Session

ROOT = Path(__file__).resolve().parents[1]
ENVS_DIR = ROOT / "src" / "rollgym" / "envs"
BUNDLED = ["lookup", "mcqa", "math", "guess", "code", "judge"]

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("env", BUNDLED)
async def test_every_bundled_environment_passes(env: str) -> None:
    report = await check_env(load_config(ENVS_DIR / env / "config.yaml"))
    assert report.ok, [f for f in report.findings if not f.ok]
    checks = {f.check for f in report.findings}
    assert {"deterministic", "sessions isolated", "uniform error body"} <= checks


class SharedStateEnv(EchoEnv):
    """Broken on purpose: the last seeded task is kept on the server, not in the session."""

    last: dict[str, Any] = {}

    async def seed_session(self, session: Session) -> None:
        type(self).last = session.task

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        expected = str(type(self).last.get("expected_answer"))
        return 1.0 if expected in output_text(response) else 0.0


class CoinEnv(EchoEnv):
    """Broken on purpose: verify is not deterministic."""

    flips = 0

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        type(self).flips += 1
        return float(type(self).flips % 3 == 0)


def _config(tmp_path: Path, impl: str) -> Path:
    rows = [
        {"responses_create_params": {"input": "say it"}, "expected_answer": word,
         "rollgym_check": {"reference": word, "wrong": "nothing"}}
        for word in ("alpha", "beta", "gamma", "delta")
    ]  # fmt: skip
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "servers": {"env": {"kind": "resources", "impl": impl}},
        "collect": {"input": "rows.jsonl"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("impl", "failing"),
    [("SharedStateEnv", "sessions isolated"), ("CoinEnv", "reference and wrong answers")],
)
async def test_a_broken_environment_fails_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, impl: str, failing: str
) -> None:
    # The servers run as processes that import this module from the repository root.
    monkeypatch.setenv("PYTHONPATH", ":".join([str(ROOT), *sys.path]))
    report = await check_env(load_config(_config(tmp_path, f"tests.test_check:{impl}")))
    failed = {f.check for f in report.findings if not f.ok}
    assert failed and not report.ok
    assert failing in failed, report.findings


# Runs the ``rollgym`` command as an install without the ``dev`` extra has it: no ``openai``.
_WITHOUT_OPENAI = (
    "import sys; sys.modules['openai'] = None; "
    "from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
)


def test_check_runs_without_the_openai_package(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENAI, "check", str(ENVS_DIR / "lookup" / "config.yaml")],
        capture_output=True, text=True, timeout=110, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout


_TOOLS: list[Any] = [
    {"type": "function", "name": "get", "parameters": {"type": "object"}, "strict": False},
    {"type": "function", "name": "get", "description": "Gets.", "extra": 1},
    {"type": "function", "name": "get", "parameters": None},
    {"type": "function", "name": "get", "strict": "yes"},
    {"type": "function", "name": 3},
    {"type": "function"},
    {"type": "web_search", "name": "get"},
    {"name": "get", "parameters": {}},
    {"type": "function", "name": "get", "parameters": ["x"]},
    {"type": "function", "name": "get", "description": 5},
]


@pytest.mark.parametrize("tool", _TOOLS)
def test_function_tool_gives_the_openai_packages_verdict(tool: Any) -> None:
    openai_types = pytest.importorskip("openai.types.responses")
    from rollgym.protocol import FunctionTool

    def valid(model: Any) -> bool:
        try:
            model.model_validate(tool)
        except ValidationError:
            return False
        return True

    assert valid(FunctionTool) == valid(openai_types.FunctionTool)
