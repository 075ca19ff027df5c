"""Reading a run directory: exit codes, a torn last line, malformed lines named by file and
line, hostile records, sparse indices, bounded memory, and health.json."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.errors import ConfigError, InputError
from rollgym.health import check_run, write_health
from rollgym.health.slots import Slots
from tests.health.cli import health_here
from tests.health.seeded import answer, clean_except, rollout, tool_turn, write_jsonl, write_run


def test_exit_codes_and_health_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = write_run(tmp_path / "clean", 3, 2)
    assert health_here(clean) == 0
    saved = orjson.loads((clean / "health.json").read_bytes())
    assert saved["passed"] is True and saved["exit_code"] == 0
    assert saved["counts"] == {"rows": 6, "rollouts": 6, "failures": 0}
    out = capsys.readouterr().out
    assert "health: all 16 judged checks passed" in out

    hollow = rollout(0, 1, output=[*tool_turn(), answer(" ")])
    sick = clean_except(tmp_path / "sick", 3, 2, {(0, 1): hollow})
    assert health_here(sick) == 1
    out = capsys.readouterr().out
    assert "FAIL hollow_turns: 0.167 > 0.01" in out
    assert "rollouts.jsonl:2 (task 0, rollout 1): turn 2 of 2 has no text and no tool call" in out
    saved = orjson.loads((sick / "health.json").read_bytes())
    assert saved["failed"] == ["hollow_turns"] and saved["exit_code"] == 1
    # Overridden, or skipped, the check no longer fails the run.
    assert health_here(sick, "--max", "hollow_turns=0.2") == 0
    capsys.readouterr()
    assert health_here(sick, "--skip", "hollow_turns", "--no-write", "--json") == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert printed["checks"][5]["id"] == "hollow_turns"
    assert printed["checks"][5]["outcome"] == "skipped"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max", "hollow_turns"], "expected CHECK=VALUE"),
        (["--max", "nope=1"], "expected CHECK=VALUE"),
        (["--max", "hollow_turns=lots"], "is not a number"),
        (["--max", "hollow_turns=2"], "a rate from 0 to 1"),
        (["--max", "duplicate_records=-1"], "a count >= 0"),
        (["--max", "failure_rate=nan"], "a rate from 0 to 1"),
        (["--skip", "hollow"], "no such check"),
        (["--window", "0"], "--window"),
    ],
)
def test_bad_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    root = write_run(tmp_path / "run", 1, 1)
    assert health_here(root, *args) == 2
    assert said in capsys.readouterr().err


def test_no_run_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert health_here(tmp_path / "nowhere") == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert health_here(tmp_path / "empty") == 2
    assert "tasks.jsonl: missing" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        check_run(tmp_path / "nowhere")


def test_a_torn_last_line_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = clean_except(tmp_path / "run", 3, 2, {(2, 1): None}, status="died")
    whole = orjson.dumps(rollout(2, 1))
    with (root / "rollouts.jsonl").open("ab") as fh:
        fh.write(whole[: len(whole) // 2])  # killed mid-write
    report = check_run(root)
    assert report.rollouts == 5 and report.exit_code == 0
    assert any("rollouts.jsonl:6: torn last line skipped" in w for w in report.warnings)
    assert health_here(root) == 0
    assert "warning: " in capsys.readouterr().out


def test_a_whole_last_record_without_its_newline_is_read(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 3, 2)
    path = root / "rollouts.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    report = check_run(root)
    assert report.rollouts == 6 and not report.warnings and report.exit_code == 0


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"task_index": 0}', "rollout_index is null"),
        (b'{"task_index": true, "rollout_index": 0}', "task_index is true"),
        (b'{"task_index": -1, "rollout_index": 0}', "task_index is -1"),
        (b'{"task_index": "0", "rollout_index": 0}', 'task_index is "0"'),
        (b'{"task_index": 0.0, "rollout_index": 0}', "task_index is 0.0"),
        (b"\xff\xfe", "not JSON"),
    ],
)
@pytest.mark.parametrize("name", ["rollouts.jsonl", "failures.jsonl", "tasks.jsonl"])
def test_a_malformed_line_names_its_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, bad: bytes, said: str
) -> None:
    root = write_run(tmp_path / "run", 2, 2, failures=[] if name != "failures.jsonl" else None)
    path = root / name
    lines = path.read_bytes().splitlines(keepends=True) or [b"\n"]
    # In the middle, or last with its newline: not a torn write.
    path.write_bytes(b"".join(lines[:1]) + bad + b"\n" + b"".join(lines[1:]))
    with pytest.raises(InputError) as caught:
        check_run(root)
    assert f"{path}:2: {said}" in str(caught.value)
    assert health_here(root) == 2
    assert f"{name}:2: " in capsys.readouterr().err
    assert not (root / "health.json").exists()


def test_a_huge_malformed_line_is_quoted_short(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 1, 1)
    (root / "rollouts.jsonl").write_bytes(b"x" * 1_000_000 + b"\n")
    with pytest.raises(InputError) as caught:
        check_run(root)
    assert len(str(caught.value)) < 400


HOSTILE: list[Any] = [
    {"response": "not an object"},
    {"response": {"output": {"type": "message"}}},
    {"response": {"output": [1, None, "x", [], {"type": None}, {"type": "message", "role": 5}]}},
    {"response": {"output": [{"type": "message", "role": "assistant",
                              "content": [[[[[[[[[[[[["deep"]]]]]]]]]]]]]}]}},
    {"response": {"output": [{"type": "message", "content": {"text": {"text": ""}}}]}},
    {"response": {"output": [{"type": "function_call", "generation_token_ids": "abc",
                              "prompt_token_ids": [True], "generation_log_probs": None}],
                  "usage": {"output_tokens": True, "input_tokens": -4}}},
    {"response": {"output": [{"type": "function_call", "generation_token_ids": [1.5, "a"],
                              "generation_log_probs": [0, 0]}], "usage": []}},
    {"response": {"status": "incomplete", "incomplete_details": "max_output_tokens"},
     "responses_create_params": {"max_output_tokens": "many"}},
    {"rollgym_timing": {"model": {"a": 1}, "retries": {"model": "lots"}}},
    {"rollgym_timing": [1, 2], "attempts": "3", "drifted_turns": -2},
    {"finished_at": float("inf")},
    {"finished_at": "yesterday", "mask_sample": "yes", "instance_config": [1]},
    {"finished_at": 1e300, "attempts": 10**18},
]  # fmt: skip


def test_hostile_records_are_findings_or_unobserved_never_a_crash(tmp_path: Path) -> None:
    rollouts = [{**rollout(0, i), **fields} for i, fields in enumerate(HOSTILE)]
    fails: list[dict[str, Any]] = [
        {"task_index": 1, "rollout_index": 0, "error": "boom", "finished_at": 1e300},
        {"task_index": 1, "rollout_index": 1, "error": {"origin": {"origin": "x"}, "server": 7}},
        {"task_index": 1, "rollout_index": 2, "error": {"server": ""}, "finished_at": -1e300},
    ]
    root = write_run(tmp_path / "run", 2, len(HOSTILE), rollouts=rollouts, failures=fails)
    (root / "metrics.json").write_bytes(orjson.dumps({"servers": {"a": [1], "b": {"c": 5}},
                                                      "http": "x"}))  # fmt: skip
    (root / "run.json").write_bytes(b'["not", "an object"]')
    report = check_run(root)
    assert report.rollouts == len(HOSTILE) and report.failures == 3
    assert {"missing_agent_turns", "token_count_mismatch"} <= set(report.failed)
    assert check_run(root).to_dict() == report.to_dict()  # deterministic
    write_health(report)


def test_sparse_indices_do_not_allocate_the_gap(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    keys = [(0, 0), (10**12, 0), (5, 10**9)]
    write_jsonl(root / "tasks.jsonl", [{"task_index": t, "rollout_index": r} for t, r in keys])
    write_jsonl(root / "rollouts.jsonl", [rollout(t, r) for t, r in keys[:2]])
    report = check_run(root)
    assert report.failed == ("missing_records",)
    missing = next(c for c in report.checks if c.id == "missing_records")
    assert [(e.task_index, e.rollout_index) for e in missing.examples] == [(5, 10**9)]
    assert not Slots(3, 10**12, 10**9)._dense


def test_memory_stays_bounded_on_a_large_ledger(tmp_path: Path) -> None:
    """The ledger is streamed: a 5,000-record run (2.5 MB of records, many times that as
    Python objects) is checked in under 1 MB, a byte per rollout slot plus a few counters."""
    root = tmp_path / "run"
    root.mkdir()
    n = 5_000
    write_jsonl(root / "tasks.jsonl", [{"task_index": t, "rollout_index": 0} for t in range(n)])
    with (root / "rollouts.jsonl").open("wb") as fh:
        for t in range(n):
            fh.write(orjson.dumps(rollout(t, 0, at=1.8e9 + t)) + b"\n")
    size = (root / "rollouts.jsonl").stat().st_size
    assert size > 2_000_000
    tracemalloc.start()
    try:
        report = check_run(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.exit_code == 0 and report.rollouts == n
    assert peak < 1_000_000, peak


def test_health_json_is_the_same_every_time(tmp_path: Path) -> None:
    root = clean_except(tmp_path / "run", 3, 2, {(1, 1): None})
    first = write_health(check_run(root)).read_bytes()
    assert write_health(check_run(root)).read_bytes() == first
    assert [p.name for p in root.iterdir() if p.name.startswith(".health")] == []


def test_health_json_is_never_written_through_a_link(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", 1, 1)
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (root / "health.json").symlink_to(target)
    assert health_here(root) == 2
    assert target.read_text() == "keep"
