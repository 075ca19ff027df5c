"""The 0.7 sweep stands alone: with no 0.4 venv it reads 0.7's own files only (its "paired with"
notes from 0.7's configs). ``sweep_one`` runs with its servers and both agents stubbed: what is
under test is what it reads, not what the servers answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interop import nemo, sweep


class _Stack:
    """``nemo.GymStack`` without processes: every server "starts" at a made-up URL."""

    def __init__(self, workspace: nemo.Workspace, config: dict[str, Any]) -> None:
        self.config = config
        self.log = None

    def start(self, timeout: float) -> dict[str, str]:
        return {name: f"http://127.0.0.1:9/{name}" for name in self.config}

    def stop(self) -> None:
        pass


def test_a_0_7_sweep_needs_no_0_4_venv(
    ng07: nemo.NemoGym, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = nemo.NemoGym.site_packages

    def only_0_7(self: nemo.NemoGym) -> Path:
        if self is nemo.NG04:
            raise RuntimeError(f"no NeMo Gym 0.4.0 in {self.venv}: run interop/setup.sh first")
        return real(self)

    monkeypatch.setattr(nemo.NemoGym, "site_packages", only_0_7)
    monkeypatch.setattr(sweep.nemo, "GymStack", _Stack)
    rewards = [{"reward": 0.0}] * 3
    monkeypatch.setattr(sweep, "rollgym_rewards", lambda *a, **k: (0, rewards))
    monkeypatch.setattr(sweep, "nemo_agent_answers", lambda *a, **k: [(200, {"reward": 1.0})] * 3)

    result = sweep.sweep_one("example_mcp_weather", "http://127.0.0.1:9", tmp_path, 3, ng07)
    # 0.7's config pairs it with claude_code_agent (its legacy_agent relay fronts that one).
    assert result["own_agents"] == ["claude_code_agent"]
    assert result["recorded"] == [1.0, 1.0, 1.0]
    assert "claude_code_agent" in sweep.table([result], known=sweep.KNOWN07)
