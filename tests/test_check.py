"""``rollgym check`` on every bundled environment, and on environments it must fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
