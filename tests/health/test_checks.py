"""Each seeded problem is flagged by its check, and only by the checks it should trip; a clean
run passes every check. Runs written by hand (``seeded.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.health import check_run, report_section
from rollgym.health.checks import SPECS
from rollgym.health.run import HealthReport
from tests.health.seeded import (
    T0,
    answer,
    clean_except,
    failure,
    rollout,
    token_call,
    tool_turn,
    write_run,
)


def outcomes(report: HealthReport) -> dict[str, str]:
    return {c.id: c.outcome for c in report.checks}


def check(report: HealthReport, name: str) -> Any:
    return next(c for c in report.checks if c.id == name)


def failed_only(root: Path, *names: str) -> HealthReport:
    """Check ``root``: exactly the checks ``names`` fail."""
    report = check_run(root)
    assert set(report.failed) == set(names), outcomes(report)
    return report


def test_a_clean_run_passes_every_check(tmp_path: Path) -> None:
    report = check_run(write_run(tmp_path / "run", 4, 3))
    assert report.exit_code == 0 and not report.warnings
    got = outcomes(report)
    assert set(got) == {s.id for s in SPECS}
    # Without token data, drift, metrics.json or integrity verdicts (hand-made records carry
    # none) there is nothing to judge: said, not passed.
    unobserved = {"token_count_mismatch", "token_drift", "failure_bursts", "server_retries",
                  "integrity_tagged"}  # fmt: skip
    assert {k for k, v in got.items() if v == "unobserved"} == unobserved
    assert all(v == "pass" for k, v in got.items() if k not in unobserved)
    assert (report.rows, report.rollouts, report.failures) == (12, 12, 0)


def test_duplicated_records_are_flagged_with_their_line(tmp_path: Path) -> None:
    twice = [rollout(1, 0), rollout(1, 0)]
    root = clean_except(tmp_path / "run", 4, 3, {(1, 0): twice})
    report = failed_only(root, "duplicate_records")
    dup = check(report, "duplicate_records")
    assert dup.count == 1
    assert (dup.examples[0].file, dup.examples[0].line) == ("rollouts.jsonl", 5)
    assert (dup.examples[0].task_index, dup.examples[0].rollout_index) == (1, 0)


def test_a_success_and_a_failure_of_one_rollout_is_a_duplicate(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 4, 3, failures=[failure(2, 2)])
    report = check_run(root)
    assert "duplicate_records" in report.failed
    assert check(report, "duplicate_records").examples[0].file == "failures.jsonl"


def test_duplicated_task_rows(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 2, 2)
    rows = (root / "tasks.jsonl").read_bytes()
    (root / "tasks.jsonl").write_bytes(rows + rows.splitlines(keepends=True)[0])
    report = failed_only(root, "duplicate_task_rows")
    assert check(report, "duplicate_task_rows").examples[0].line == 5


@pytest.mark.parametrize(
    "last",
    [
        answer(""),
        answer("   \n\t"),
        {"type": "message", "role": "assistant", "content": []},
        {"type": "message", "role": "assistant"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": ""}]},
    ],
    ids=["empty", "blank", "no-content", "content-missing", "empty-reasoning"],
)
def test_a_hollow_turn(tmp_path: Path, last: dict[str, Any]) -> None:
    hollow = rollout(3, 1, output=[*tool_turn(), last])
    report = failed_only(clean_except(tmp_path / "run", 4, 3, {(3, 1): hollow}), "hollow_turns")
    example = check(report, "hollow_turns").examples[0]
    assert (example.task_index, example.rollout_index, example.line) == (3, 1, 11)
    assert "turn 2 of 2" in example.note


def test_reasoning_with_text_or_a_tool_call_is_no_hollow_turn(tmp_path: Path) -> None:
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}
    records = {(0, 0): rollout(0, 0, output=[thought, *tool_turn(), answer()])}
    assert check_run(clean_except(tmp_path / "run", 1, 1, records)).exit_code == 0


def test_a_rollout_without_model_output(tmp_path: Path) -> None:
    empty = rollout(0, 2, output=[])
    user_only = rollout(1, 2, output=[{"type": "message", "role": "user", "content": "hi"}])
    root = clean_except(tmp_path / "run", 2, 3, {(0, 2): empty, (1, 2): user_only})
    report = failed_only(root, "missing_agent_turns")
    assert check(report, "missing_agent_turns").count == 2


def test_a_task_that_always_fails(tmp_path: Path) -> None:
    records = {(2, r): None for r in range(3)}
    fails = [failure(2, r) for r in range(3)]
    root = clean_except(tmp_path / "run", 4, 3, records, failures=fails)
    report = failed_only(root, "tasks_always_failing", "failure_rate")
    always = check(report, "tasks_always_failing")
    assert (always.count, always.of, always.examples[0].task_index) == (1, 4, 2)
    assert check(report, "failure_rate").detail["by_server"] == {"model": 3}


def test_a_task_that_fails_sometimes_is_no_task_that_always_fails(tmp_path: Path) -> None:
    root = clean_except(tmp_path / "run", 4, 3, {(2, 0): None}, failures=[failure(2, 0)])
    report = check_run(root, {"failure_rate": 0.1})
    assert report.exit_code == 0, outcomes(report)


def test_a_task_consistently_unhealthy(tmp_path: Path) -> None:
    """Task 1: one repeat failed, the others answered nothing (0.7's
    task_consistently_unhealthy); task 3 has one hollow repeat of three, no more."""
    empty = {"input_tokens": 30, "output_tokens": 0}
    records: dict[tuple[int, int], Any] = {
        (1, 0): None,
        (1, 1): rollout(1, 1, output=[*tool_turn(), answer("")]),
        (1, 2): rollout(1, 2, usage=empty),
        (3, 0): rollout(3, 0, output=[*tool_turn(), answer("")]),
    }
    root = clean_except(tmp_path / "run", 4, 3, records, failures=[failure(1, 0)])
    report = check_run(root, {"failure_rate": 0.1, "hollow_turns": 0.2,
                              "zero_completion_tokens": 0.1})  # fmt: skip
    assert report.failed == ("tasks_always_unhealthy",), outcomes(report)
    sick = check(report, "tasks_always_unhealthy")
    assert [(e.task_index, e.note) for e in sick.examples] == [
        (1, "all 3 records failed or have a finding")
    ]


def test_missing_token_counts(tmp_path: Path) -> None:
    bare = rollout(2, 2)
    del bare["response"]["usage"]
    report = failed_only(clean_except(tmp_path / "run", 4, 3, {(2, 2): bare}),
                         "missing_token_counts")  # fmt: skip
    assert check(report, "zero_completion_tokens").of == 11


def test_zero_completion_tokens_from_usage(tmp_path: Path) -> None:
    none = rollout(0, 0, usage={"input_tokens": 40, "output_tokens": 0})
    report = failed_only(clean_except(tmp_path / "run", 4, 3, {(0, 0): none}),
                         "zero_completion_tokens")  # fmt: skip
    assert check(report, "zero_completion_tokens").of == 12


def test_zero_completion_tokens_from_token_ids(tmp_path: Path) -> None:
    call, fed, last = tool_turn()[0], tool_turn()[1], answer()
    out = [token_call(call, 10, 0), fed, token_call(last, 12, 5)]
    record = rollout(0, 0, output=out, usage={"input_tokens": 22, "output_tokens": 5})
    report = check_run(clean_except(tmp_path / "run", 4, 3, {(0, 0): record}))
    assert report.failed == ("zero_completion_tokens",)


def test_runaway_generations(tmp_path: Path) -> None:
    cut = rollout(1, 1)
    cut["response"] |= {
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    at_limit = rollout(1, 2, output=[token_call(answer(), 8, 64)],
                       usage={"input_tokens": 8, "output_tokens": 64},
                       responses_create_params={"input": "q", "max_output_tokens": 64})  # fmt: skip
    root = clean_except(tmp_path / "run", 4, 3, {(1, 1): cut, (1, 2): at_limit})
    assert check(failed_only(root, "runaway_generations"), "runaway_generations").count == 2


def test_token_count_mismatches(tmp_path: Path) -> None:
    call, fed = tool_turn()
    good = [token_call(call, 10, 3), fed, token_call(answer(), 15, 4)]
    short_logprobs = [token_call(call, 10, 3), fed, {**token_call(answer(), 15, 4),
                                                     "generation_log_probs": [-1.0]}]  # fmt: skip
    usage = {"input_tokens": 25, "output_tokens": 7}
    records = {
        (0, 0): rollout(0, 0, output=good, usage=usage),
        (0, 1): rollout(0, 1, output=good, usage={"input_tokens": 25, "output_tokens": 9}),
        (0, 2): rollout(0, 2, output=short_logprobs, usage=usage),
        (1, 0): rollout(1, 0, output=good, usage={"input_tokens": 24, "output_tokens": 7}),
    }
    report = failed_only(clean_except(tmp_path / "run", 4, 3, records), "token_count_mismatch")
    mismatch = check(report, "token_count_mismatch")
    assert (mismatch.count, mismatch.of) == (3, 4)
    notes = [e.note for e in mismatch.examples]
    assert "usage.output_tokens 9 != 7 generation_token_ids" in notes[0]
    assert "logprob" in notes[1] and "input_tokens 24" in notes[2]


def test_token_data_a_trainer_would_refuse_is_a_mismatch(tmp_path: Path) -> None:
    # The trainers' one reading (models.tokens.item_tokens): no prompt ids, a negative id or a
    # positive logprob makes every bridge mask the rollout, so health does not pass it.
    call, fed = tool_turn()
    last = token_call(answer(), 15, 4)
    no_prompt = {k: v for k, v in last.items() if k != "prompt_token_ids"}
    negative = {**last, "generation_token_ids": [-1, *last["generation_token_ids"][1:]]}
    positive = {**last, "generation_log_probs": [0.5] * len(last["generation_log_probs"])}
    usage = {"input_tokens": 25, "output_tokens": 7}
    records = {
        (t, 0): rollout(t, 0, output=[token_call(call, 10, 3), fed, bad], usage=usage)
        for t, bad in enumerate((no_prompt, negative, positive))
    }
    report = failed_only(clean_except(tmp_path / "run", 4, 3, records), "token_count_mismatch")
    assert check(report, "token_count_mismatch").count == 3


def test_token_drift(tmp_path: Path) -> None:
    records = {(t, r): rollout(t, r, drifted_turns=0) for t in range(4) for r in range(3)}
    records[(3, 0)] = rollout(3, 0, drifted_turns=2)
    report = failed_only(clean_except(tmp_path / "run", 4, 3, records), "token_drift")
    assert (check(report, "token_drift").count, check(report, "token_drift").of) == (1, 12)
    records[(3, 0)] = rollout(3, 0, drifted_turns=0)
    assert check_run(clean_except(tmp_path / "ok", 4, 3, records)).exit_code == 0


def test_retries_per_model_call_and_attempts(tmp_path: Path) -> None:
    retried = rollout(0, 0, attempts=3)
    retried["rollgym_timing"] = {"model": [0.1, 0.1], "retries": {"model": 7}}
    records = {(0, 0): retried, (0, 1): rollout(0, 1, attempts=2)}  # 2 of 12: above 0.1
    report = failed_only(clean_except(tmp_path / "run", 4, 3, records),
                         "model_call_retries", "rollout_attempts")  # fmt: skip
    assert (check(report, "model_call_retries").count, check(report, "model_call_retries").of) \
        == (7, 24)  # fmt: skip


def test_server_retries_from_metrics(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 4, 3)
    servers = {"agent": {"model": {"calls": 100, "retries": 30}, "env": {"calls": 5, "retries": 5}}}
    (root / "metrics.json").write_bytes(orjson.dumps({"servers": servers}))
    report = failed_only(root, "server_retries")
    assert check(report, "server_retries").detail["worst"] == "agent->model"


def test_masked_samples(tmp_path: Path) -> None:
    masked = rollout(0, 0, mask_sample=True)
    # NeMo RL's flag: rollgym's line carries it at the top too (its reader reads the top).
    nested = rollout(0, 1, mask_sample=True, instance_config={"mask_sample": True})
    report = failed_only(clean_except(tmp_path / "run", 4, 3, {(0, 0): masked, (0, 1): nested}),
                         "masked_samples")  # fmt: skip
    assert check(report, "masked_samples").count == 2


def _verdict(task: int, tagged: bool, version: int | None = None) -> dict[str, Any]:
    found = {"verdict": "exploit", "reasons": ["early_exit: os._exit"]} if tagged else {
        "verdict": "clean", "reasons": []}  # fmt: skip
    record = rollout(task, 0, integrity=found)
    if version is not None:
        record["response"]["rollgym_upstream"] = [{"rollgym_policy_version": version}]
    return record


@pytest.mark.parametrize("tagged", [2, 3])
def test_integrity_tagged_fires_above_two_percent(tmp_path: Path, tagged: int) -> None:
    records = [_verdict(t, t < tagged) for t in range(100)]
    report = check_run(write_run(tmp_path / "run", 100, 1, rollouts=records))
    result = check(report, "integrity_tagged")
    assert (result.count, result.of) == (tagged, 100)
    assert result.outcome == ("fail" if tagged > 2 else "pass")  # 2% is the line, not over it
    assert set(report.failed) <= {"integrity_tagged"}
    assert result.detail["exploit"] == tagged and result.detail["by_class"] == {
        "early_exit": tagged}  # fmt: skip
    assert result.examples[0].note == "exploit: early_exit: os._exit"


def test_integrity_tagged_judges_each_policy_step(tmp_path: Path) -> None:
    # 3 of 150 tagged (2%: the run passes), all in step 1's 50 rollouts (6%: it fails).
    records = [_verdict(t, False, 0) for t in range(100)]
    records += [_verdict(100 + t, t < 3, 1) for t in range(50)]
    report = failed_only(write_run(tmp_path / "run", 150, 1, rollouts=records), "integrity_tagged")
    result = check(report, "integrity_tagged")
    assert (result.count, result.of, result.detail["worst_step"]) == (3, 50, 1)
    assert result.detail["steps"] == [[0, 0, 100], [1, 3, 50]]
    # A step too small to judge alone counts in the run only.
    small = [_verdict(t, False, 0) for t in range(100)] + [_verdict(100, True, 1)]
    report = check_run(write_run(tmp_path / "small", 101, 1, rollouts=small))
    assert check(report, "integrity_tagged").outcome == "pass"


def test_failures_by_server_over_time(tmp_path: Path) -> None:
    # An hour of good work, then a minute when most rollouts fail at the judge.
    good = [rollout(t, 0, at=T0 + t * 90) for t in range(40)]
    late = [rollout(40 + t, 0, at=T0 + 3600 + t) for t in range(10)]
    bad = [failure(50 + t, 0, server="judge", at=T0 + 3600 + t) for t in range(20)]
    root = write_run(tmp_path / "run", 70, 1, rollouts=good + late, failures=bad)
    report = check_run(root, {"failure_rate": 1.0})
    assert report.failed == ("failure_bursts",), outcomes(report)
    burst = check(report, "failure_bursts")
    assert (burst.count, burst.of) == (20, 30)
    assert burst.detail["worst"] == {"server": "judge", "window_start": (T0 + 3600) // 60 * 60}
    assert burst.detail["timeline"]["judge"] == [[(T0 + 3600) // 60 * 60, 20, 30]]
    # Spread over the hour, the same failures are no burst.
    spread = [failure(50 + t, 0, server="judge", at=T0 + t * 180) for t in range(20)]
    calm = write_run(tmp_path / "calm", 70, 1, rollouts=good + late, failures=spread)
    assert check_run(calm, {"failure_rate": 1.0}).exit_code == 0


def test_a_ledger_gap(tmp_path: Path) -> None:
    root = clean_except(tmp_path / "run", 4, 3, {(2, 1): None, (3, 2): None})
    report = failed_only(root, "missing_records")
    keys = [(e.task_index, e.rollout_index) for e in check(report, "missing_records").examples]
    assert keys == [(2, 1), (3, 2)]


@pytest.mark.parametrize("status", ["aborted", "running", "failed_to_start"])
def test_a_gap_in_a_run_that_did_not_complete_is_not_judged(tmp_path: Path, status: str) -> None:
    root = clean_except(tmp_path / "run", 4, 3, {(2, 1): None}, status=status)
    report = check_run(root)
    assert report.exit_code == 0
    assert check(report, "missing_records").outcome == "unobserved"
    assert check(report, "missing_records").detail["pending"] == 1
    assert any(status in w for w in report.warnings)


def test_records_of_no_task_row(tmp_path: Path) -> None:
    extra = [rollout(t, r) for t in range(2) for r in range(2)] + [rollout(9, 0), rollout(0, 5)]
    report = failed_only(write_run(tmp_path / "run", 2, 2, rollouts=extra), "unknown_records")
    assert check(report, "unknown_records").count == 2


def test_thresholds_and_skips(tmp_path: Path) -> None:
    hollow = rollout(3, 1, output=[*tool_turn(), answer("")])
    root = clean_except(tmp_path / "run", 4, 3, {(3, 1): hollow})
    assert check_run(root, {"hollow_turns": 0.1}).exit_code == 0
    report = check_run(root, skip={"hollow_turns"})
    assert report.exit_code == 0 and check(report, "hollow_turns").outcome == "skipped"


def test_the_report_section_shows_the_checks(tmp_path: Path) -> None:
    hollow = rollout(3, 1, output=[*tool_turn(), answer("")])
    root = clean_except(tmp_path / "run", 4, 3, {(3, 1): hollow})
    page = report_section(root, "step-<1>")
    assert "Health: step-&lt;1&gt; (1 failed: hollow_turns)" in page
    assert page.index("hollow_turns") < page.index("duplicate_records")  # failures first
    assert "rollouts.jsonl:11 (task 3, rollout 1)" in page
    broken = write_run(tmp_path / "broken", 1, 1)
    (broken / "rollouts.jsonl").write_bytes(b"{oops\n{}\n")
    assert "Not checked:" in report_section(broken, "b")
    assert "rollouts.jsonl:1" in report_section(broken, "b")
