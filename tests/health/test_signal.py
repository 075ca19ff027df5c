"""``no_signal_groups``: the share of tasks whose scored rollouts all got the same reward (no
gradient for GRPO), over the run, per environment and per time window. Runs written by hand
(``seeded.py``); a real one in ``tests/collect/test_unscripted.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.health import check_run, thresholds
from rollgym.health.show import table
from tests.health.cli import health_here
from tests.health.seeded import T0, failure, rollout, write_run


def signal(root: Path, **limits: float) -> Any:
    report = check_run(root, limits or None)
    return report, next(c for c in report.checks if c.id == "no_signal_groups")


def test_every_group_scored_zero_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's run: 10 tasks x 4 repeats, every reward 0, nothing failed."""
    zeros = [rollout(t, r, reward=0.0) for t in range(10) for r in range(4)]
    root = write_run(tmp_path / "run", 10, 4, rollouts=zeros)
    report, check = signal(root)
    assert report.failed == ("no_signal_groups",)
    assert (check.count, check.of, check.value) == (10, 10, 1.0)
    assert check.detail["by_reward"] == {"0": 10}
    assert check.examples[0].where() == "task 0: all 4 rewards are 0: no gradient"
    assert health_here(root) == 1
    out = capsys.readouterr().out
    assert "FAIL no_signal_groups: 1.000 > 0.5" in out
    assert "groups without signal (rewards all equal): 10/10" in out


def test_all_ones_or_one_shared_value_is_no_signal_either(tmp_path: Path) -> None:
    rows = [rollout(t, r, reward=[1.0, 0.5, 0.5][t]) for t in range(3) for r in range(2)]
    report, check = signal(write_run(tmp_path / "run", 3, 2, rollouts=rows))
    assert report.failed == ("no_signal_groups",)
    assert (check.count, check.of) == (3, 3)
    assert check.detail["by_reward"] == {"0.5": 2, "1": 1}


def test_mixed_groups_pass_and_the_threshold_is_a_rate(tmp_path: Path) -> None:
    # Tasks 0-1 all 0 (no signal), tasks 2-5 mixed: 2/6 under the default 0.5.
    rows = [
        rollout(t, r, reward=0.0 if t < 2 else float(r % 2)) for t in range(6) for r in range(3)
    ]
    root = write_run(tmp_path / "run", 6, 3, rollouts=rows)
    report, check = signal(root)
    assert report.exit_code == 0 and check.outcome == "pass"
    assert (check.count, check.of) == (2, 6)
    assert [e.task_index for e in check.examples] == [0, 1]
    strict = check_run(root, thresholds(["no_signal_groups=0.25"]))
    assert strict.failed == ("no_signal_groups",)


def test_only_groups_of_two_or_more_scored_rollouts_count(tmp_path: Path) -> None:
    """A failure is never a reward of 0, and a masked rollout is no measurement: task 0 has
    one scored rollout (no group); task 1's failure does not make it a group of differing
    rewards; with one repeat there is nothing to judge."""
    rows = [
        rollout(0, 0, reward=1.0),
        rollout(0, 1, reward=0.0, mask_sample=True),
        rollout(1, 0, reward=1.0),
        rollout(1, 1, reward=1.0),
        rollout(2, 0, reward=1.0),
        rollout(2, 1, reward=0.0),
    ]
    root = write_run(tmp_path / "run", 3, 3, rollouts=rows, failures=[failure(1, 2)])
    _, check = signal(root)
    assert (check.count, check.of) == (1, 2)
    assert check.examples[0].task_index == 1
    one = write_run(tmp_path / "one", 4, 1, rollouts=[rollout(t, 0) for t in range(4)])
    _, check = signal(one)
    assert check.outcome == "unobserved" and check.of == 0


def test_a_reward_that_is_no_number_joins_no_group(tmp_path: Path) -> None:
    rows = [rollout(0, 0, reward=1.0), rollout(0, 1, reward=None), rollout(0, 2, reward=0.0)]
    _, check = signal(write_run(tmp_path / "run", 1, 3, rollouts=rows))
    assert (check.count, check.of) == (0, 1)


def two_environments(root: Path, math_flat: int) -> Path:
    """A run of two agents, each verifying with its own resources server (run.json as the
    collector writes it): 6 math tasks (``math_flat`` of them all 0), 14 lookup tasks, mixed;
    rows name their agent by ``agent_ref``, lookup's by the run's default."""
    rows = []
    for t in range(20):
        ref = {"agent_ref": {"name": "math_agent"}} if t < 6 else {}
        flat = t < math_flat
        rows += [rollout(t, r, reward=0.0 if flat else float(r % 2), **ref) for r in range(2)]
    write_run(root, 20, 2, rollouts=rows)
    servers = {
        "model": {"kind": "model", "impl": "scripted"},
        "math": {"kind": "resources", "impl": "math"},
        "lookup": {"kind": "resources", "impl": "lookup"},
        "math_agent": {"kind": "agent", "options": {"resources": "math"}},
        "lookup_agent": {"kind": "agent", "options": {"resources": "lookup"}},
    }
    run = {"status": "completed", "config": {"servers": servers},
           "collect": {"agent": "lookup_agent", "agent_aliases": {}}}  # fmt: skip
    (root / "run.json").write_bytes(orjson.dumps(run))
    return root


def test_per_environment_and_the_worst_one_is_judged(tmp_path: Path) -> None:
    report, check = signal(two_environments(tmp_path / "run", math_flat=6))
    # The run's share (6/20) passes; math's own (6/6) does not: a dead environment is not
    # hidden by a lively one.
    assert check.detail["by_environment"] == {
        "lookup": {"no_signal": 0, "groups": 14, "share": 0.0},
        "math": {"no_signal": 6, "groups": 6, "share": 1.0},
    }
    assert (check.detail["no_signal"], check.detail["groups"]) == (6, 20)
    assert check.detail["judged"] == "math"
    assert (check.count, check.of) == (6, 6) and report.failed == ("no_signal_groups",)
    assert "by environment: lookup 0/14, math 6/6" in table(report)
    _, check = signal(two_environments(tmp_path / "ok", math_flat=2))
    assert check.outcome == "pass" and check.detail["judged"] == "math"
    assert (check.count, check.of) == (2, 6)


def test_groups_over_time_by_their_last_rollout(tmp_path: Path) -> None:
    """Early groups carry signal, late ones do not (the policy saturated): the timeline shows
    it per window, dated by each group's last rollout."""
    rows = []
    for t in range(6):
        late = t >= 3
        at = T0 + (130.0 if late else 10.0)
        rows += [rollout(t, r, reward=1.0 if late else float(r), at=at) for r in range(2)]
    rows[-1]["finished_at"] = T0 + 200.0  # task 5 finishes in a later window still
    _, check = signal(write_run(tmp_path / "run", 6, 2, rollouts=rows))
    start = (T0 // 60) * 60
    assert check.detail["timeline"] == [[start, 0, 3], [start + 120, 2, 2], [start + 180, 1, 1]]
    assert check.detail["timeline_columns"] == ["window_start", "no_signal", "groups"]


def test_a_task_that_always_fails_is_named_in_words(tmp_path: Path) -> None:
    fails = [failure(2, r) for r in range(3)]
    rows = [rollout(t, r) for t in range(4) for r in range(3) if t != 2]
    report = check_run(write_run(tmp_path / "run", 4, 3, rollouts=rows, failures=fails))
    shown = table(report)
    assert "  task 2: all 3 records are failures" in shown
    assert "None" not in shown
