"""Every bundled environment comes out of ``rollgym audit`` clean: a finding there is our bug.

Each config is audited as the command does it (its servers started as processes). The two
environments with a known finding are marked strict xfail with what the audit found, so the
test turns red the day they are fixed (and the mark must go)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollgym.audit.run import audit_config
from rollgym.config import load_config

pytestmark = pytest.mark.timeout(300)

ENVS = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs"
KNOWN = {
    "math": "prompt_echo: 'Compute $\\frac{3}{4} + \\frac{1}{8}$...' echoed back is paid 1.0: "
    "math-verify evaluates the prompt's expression to the reference (2 of 8 rows)",
    "reasoning_gym": "format_only: '<answer></answer>' is paid 0.05 on arc_agi, whose own "
    "score_answer pays any board that parses (the empty one too) and 0 to a wrong word",
}


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(
            p.parent.name, marks=pytest.mark.xfail(reason=KNOWN[p.parent.name], strict=True)
        )
        if p.parent.name in KNOWN
        else p.parent.name
        for p in sorted(ENVS.glob("*/config.yaml"))
    ],
)
async def test_a_bundled_environment_is_clean(env: str, tmp_path: Path) -> None:
    report = await audit_config(load_config(ENVS / env / "config.yaml"), log_dir=tmp_path)
    for name, audit in report.servers.items():
        assert audit.verdict == "clean", (name, [f.to_dict() for f in audit.findings])
        assert audit.skipped == 0
