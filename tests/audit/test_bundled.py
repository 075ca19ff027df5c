"""Every bundled environment comes out of ``rollgym audit`` clean: a finding there is our bug.

Each config is audited as the command does it (its servers started as processes). The audit
once found two: math paid a prompt given back (math-verify evaluated its expression to the
reference) and reasoning_gym paid ``<answer></answer>`` 0.05 on arc_agi (reasoning-gym's
scorer pays any board that parses); both environments now score those 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollgym.audit.run import audit_config
from rollgym.config import load_config

pytestmark = pytest.mark.timeout(300)

ENVS = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs"


@pytest.mark.parametrize("env", [p.parent.name for p in sorted(ENVS.glob("*/config.yaml"))])
async def test_a_bundled_environment_is_clean(env: str, tmp_path: Path) -> None:
    report = await audit_config(load_config(ENVS / env / "config.yaml"), log_dir=tmp_path)
    for name, audit in report.servers.items():
        assert audit.verdict == "clean", (name, [f.to_dict() for f in audit.findings])
        assert audit.skipped == 0
