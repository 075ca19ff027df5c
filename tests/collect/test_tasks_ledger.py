"""Task files (validated up front, errors naming file and line) and the ledger's tail repair."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from rollgym.collect.ledger import Ledger
from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.collect.tasks import iter_rollouts, materialize, scan_tasks
from rollgym.errors import EnvironmentFailure, HTTPStatusError, InputError
from tests.support.ledger import read_jsonl
from tests.support.stack import task_row, write_tasks


def test_bad_json_on_line_3_names_the_file_and_line(tmp_path: Path) -> None:
    path = write_tasks(tmp_path / "tasks.jsonl", 2)
    with path.open("ab") as fh:
        fh.write(b'{"responses_create_params": {"input": "x"\n')
    with pytest.raises(InputError, match=rf"^{path}:3: not valid JSON"):
        scan_tasks(path)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"expected_answer": "x"}, "missing required field 'responses_create_params'"),
        ({"responses_create_params": {}}, "missing required field 'responses_create_params.input'"),
        ({"responses_create_params": {"input": 3}}, "responses_create_params.input"),
        ([1, 2], "a task must be a JSON object"),
    ],
)
def test_a_malformed_row_names_the_file_and_line(tmp_path: Path, row: object, reason: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(orjson.dumps(task_row(0)) + b"\n" + orjson.dumps(row) + b"\n")
    with pytest.raises(InputError) as info:
        scan_tasks(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert reason in str(info.value)


def test_an_empty_or_missing_file_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"\n\n")
    with pytest.raises(InputError, match="no tasks"):
        scan_tasks(tmp_path / "empty.jsonl")
    with pytest.raises(InputError, match="cannot read task file"):
        scan_tasks(tmp_path / "absent.jsonl")


def test_materialize_expands_repeats_and_stamps_indices(tmp_path: Path) -> None:
    src = write_tasks(tmp_path / "tasks.jsonl", 3)
    with src.open("ab") as fh:
        fh.write(b"\n")  # blank lines are skipped
    info = scan_tasks(src, limit=2)
    assert info.tasks == 2
    total = materialize(src, tmp_path / "out.jsonl", repeats=3, limit=2)
    assert total == 6
    assert [(t, r) for t, r, _ in iter_rollouts(tmp_path / "out.jsonl")] == [
        (t, r) for t in range(2) for r in range(3)
    ]
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert rows[4]["expected_answer"] == "v1"


def _result(task: int, rollout: int) -> ScoredRollout:
    return ScoredRollout(task, rollout, 1.0, 1, 0.1, {"response": {"id": f"resp_{task}"}})


def _ledger_with(tmp_path: Path, n: int) -> Path:
    ledger = Ledger(tmp_path, n, 1)
    ledger.load(3)
    ledger.open()
    for i in range(n):
        ledger.add(_result(i, 0))
    ledger.close()
    return tmp_path / "rollouts.jsonl"


@pytest.mark.parametrize("cut", [1, 20, -1])
def test_a_torn_last_record_is_cut_and_its_rollout_pending(tmp_path: Path, cut: int) -> None:
    path = _ledger_with(tmp_path, 3)
    whole = path.read_bytes()
    lines = whole.splitlines(keepends=True)
    path.write_bytes(whole[: len(whole) - len(lines[-1]) + (cut % (len(lines[-1]) - 1))])
    ledger = Ledger(tmp_path, 3, 1)
    ledger.load(3)
    assert path.read_bytes() == b"".join(lines[:2])
    assert ledger.succeeded == 2 and not ledger.is_done(2, 0) and ledger.is_done(1, 0)


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = _ledger_with(tmp_path, 3)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])  # killed between the record and its newline
    ledger = Ledger(tmp_path, 3, 1)
    ledger.load(3)
    assert path.read_bytes() == whole
    assert ledger.succeeded == 3 and ledger.pending == 0


def test_a_corrupt_record_in_the_middle_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = _ledger_with(tmp_path, 3)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"garbage\n" + lines[2])
    with pytest.raises(InputError, match=rf"{path}:2: corrupt ledger record"):
        Ledger(tmp_path, 3, 1).load(3)


def test_a_duplicate_record_is_ignored(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, 2, 1)
    ledger.load(3)
    ledger.open()
    ledger.add(_result(0, 0))
    ledger.add(_result(0, 0))
    ledger.close()
    assert len(read_jsonl(tmp_path / "rollouts.jsonl")) == 1
    assert ledger.succeeded == 1 and ledger.pending == 1


def test_a_row_naming_an_unknown_agent_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"name": "agent"}},
        {"responses_create_params": {"input": "b"}, "agent_ref": {"name": "lookup"}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert scan_tasks(path, agents={"agent", "lookup"}).tasks == 2
    with pytest.raises(
        InputError, match=r"tasks\.jsonl:2: agent_ref\.name 'lookup' is not an agent"
    ):
        scan_tasks(path, agents={"agent"})


@pytest.mark.parametrize("terminal", [True, False])
def test_resume_does_not_retry_what_an_environment_server_called_terminal(
    tmp_path: Path, terminal: bool
) -> None:
    # NeMo Gym 0.7's resume never retries a terminal episode failure; rollgym's own errors keep
    # the attempts rule (a non-terminal report, with attempts left, runs again).
    ledger = Ledger(tmp_path, 2, 1)
    ledger.load(3)
    ledger.open()
    error = EnvironmentFailure("the task is broken", terminal=terminal, stage="seed")
    ledger.add(FailedRollout(0, 0, error, 1, 0.1))
    ledger.add(FailedRollout(1, 0, HTTPStatusError("boom", status=500, retryable=False), 1, 0.1))
    ledger.close()
    again = Ledger(tmp_path, 2, 1)
    again.load(3)
    assert again.is_done(0, 0) is terminal
    assert not again.is_done(1, 0)  # attempts left: rollgym's rule
