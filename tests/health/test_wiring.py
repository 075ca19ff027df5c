"""``rollgym health`` in the ``rollgym`` command and its section in ``rollgym report``: these
run once /work/notes/patches/health-cli.diff and health-report.diff are applied (skipped
before, naming the patch)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tests.health.seeded import answer, clean_except, rollout, tool_turn
from tests.support.cli_here import rollgym_here


def test_rollgym_health_is_a_command(tmp_path: Path) -> None:
    from rollgym.cli import main

    if "health" not in inspect.getsource(main._register):
        pytest.skip("rollgym.cli.main does not register health yet: health-cli.diff")
    hollow = rollout(0, 1, output=[*tool_turn(), answer("")])
    assert rollgym_here("health", clean_except(tmp_path / "sick", 2, 2, {(0, 1): hollow})) == 1
    assert rollgym_here("health", clean_except(tmp_path / "well", 2, 2, {})) == 0
    assert rollgym_here("health", tmp_path / "nowhere") == 2


def test_the_report_has_a_health_section(tmp_path: Path) -> None:
    from rollgym.report import page, write_report

    if "report_section" not in inspect.getsource(page):
        pytest.skip("rollgym.report.page shows no health section yet: health-report.diff")
    hollow = rollout(0, 1, output=[*tool_turn(), answer("")])
    sick = clean_except(tmp_path / "sick", 2, 2, {(0, 1): hollow})
    well = clean_except(tmp_path / "well", 2, 2, {})
    html = write_report(sick, [well]).path.read_text()
    assert "<h2>Health: sick (1 failed: hollow_turns)</h2>" in html
    assert "<h2>Health: well (all passed)</h2>" in html
    assert not (sick / "health.json").exists()  # the report writes only report.html
