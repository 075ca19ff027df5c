"""Failures counted by root cause (``rollgym.errors.root_cause``), with the deadline, budget or
breaker that ended them beside, wherever a run counts them: a real ``rollgym run`` against a
model server whose upstream refuses every connection (agent -> ``openai_proxy`` -> a dead
port) names ``connect_error`` in its summary, ``metrics.json``, ``run.json``'s abort,
``rollgym health`` and ``rollgym report``, where the type of the error it started at reads
``budget_exhausted`` (the proxy's retry budget refused one more try). The live status line
and the collector's Prometheus family count the same way, from a bounded set of labels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from rollgym.collect.live import RunWatch
from rollgym.collect.records import FailedRollout
from rollgym.errors import (
    ENDING_TYPES,
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    HTTPStatusError,
    ReplicaDown,
    RollgymError,
    is_known_type,
)
from tests.models.test_freeze import REPO, rollgym_run
from tests.support.echo_run import write_echo_run

pytestmark = pytest.mark.timeout(180)

CAUSE = re.compile(r"connect_error (\d+) \(budget_exhausted (\d+)\)")


def rollgym(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=100,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"},
    )  # fmt: skip


def test_a_dead_upstream_is_named_as_the_root_cause_everywhere(
    tmp_path: Path, dead_url: Callable[[], str]
) -> None:
    config = write_echo_run(tmp_path, dead_url(), 200, 16)
    out = tmp_path / "out"
    done = rollgym_run(config, out)
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted", done.stderr[-3000:]
    failed = len((out / "failures.jsonl").read_bytes().splitlines())

    # metrics.json: by_type keeps its meaning (where each failure started), by_root is new.
    failures = orjson.loads((out / "metrics.json").read_bytes())["failures"]
    assert set(failures["by_type"]) <= {"budget_exhausted", "connect_error"}
    assert failures["by_type"].get("budget_exhausted"), failures
    assert failures["by_root"] == {"connect_error": failed}
    spent = failures["by_root_context"]["connect_error"]["budget_exhausted"]
    assert spent == failures["by_type"]["budget_exhausted"]

    # The run summary and the abort message name the cause, the budget beside it.
    assert CAUSE.search(done.stdout), done.stdout
    abort = run["abort"]
    assert abort["by_root"] == {"connect_error": failed}
    assert abort["by_root_context"]["connect_error"]["budget_exhausted"] > 0
    assert abort["sample_error"]["root_cause"] == "connect_error"
    assert "of the last" in abort["reason"]
    assert "by root cause: connect_error" in abort["reason"]
    assert CAUSE.search(abort["reason"])

    health = rollgym("health", str(out))
    line = f"failures by root cause: connect_error {failed} (budget_exhausted {spent})"
    assert line in health.stdout, health.stdout + health.stderr
    detail = orjson.loads((out / "health.json").read_bytes())
    rate = next(c for c in detail["checks"] if c["id"] == "failure_rate")
    assert rate["detail"]["by_root"] == {"connect_error": failed}

    report = rollgym("report", str(out))
    assert report.returncode == 0, report.stderr
    page = (out / "report.html").read_text()
    assert f"connect_error {failed} (budget_exhausted {spent})" in page
    assert "Failures by root cause" in page


def test_failure_records_keep_each_fact_once(tmp_path: Path, dead_url: Callable[[], str]) -> None:
    """A failure record grew by a copy of its chain at each hop (message and body: 8.1 KB for
    a dead upstream); each message and body is now kept once."""
    config = write_echo_run(tmp_path, dead_url(), 8, 2)
    out = tmp_path / "out"
    rollgym_run(config, out)
    lines = (out / "failures.jsonl").read_bytes().splitlines()
    assert lines
    for raw in lines:
        assert len(raw) < 3000
        record = orjson.loads(raw)
        node, messages = record["error"], []
        while node is not None:
            messages.append(node["message"])
            assert not node.get("origin") or node["origin"]["message"] not in node["message"]
            assert not node.get("origin") or "origin" not in (node.get("body") or "")
            node = node.get("origin")
        assert len(messages) >= 3  # agent -> model -> model.upstream
        # The whole story still reads once, in order, in the error's text.
        text = str(RollgymError.from_dict(record["error"]))
        assert all(text.count(m) == 1 for m in messages), text
        assert "_ng_failure_message" not in record  # a plain run's line is rollgym's own


def _refused(cause: RollgymError | None) -> RollgymError:
    refusal = CircuitOpen(
        "circuit for model.upstream is open", server="model.upstream", origin=cause
    )
    return HTTPStatusError("agent answered 502", status=502, server="agent", origin=refusal)


def test_the_live_counts_are_by_root_cause_with_bounded_labels() -> None:
    watch = RunWatch()
    down = ReplicaDown("failed its liveness probe", server="model.upstream")
    for i in range(3):
        watch(FailedRollout(i, 0, _refused(down), 1, 0.1))
    watch(FailedRollout(3, 0, _refused(None), 1, 0.1))  # a breaker that says nothing more
    spent = BudgetExhausted("spent", server="model.upstream", origin=ConnectError("refused"))
    watch(FailedRollout(4, 0, spent, 1, 0.1))
    assert watch.causes[("replica_down", "circuit_open")] == 3
    assert watch.causes[("circuit_open", "none")] == 1
    assert watch.causes[("connect_error", "budget_exhausted")] == 1
    # Labels come from the tree's types: a cause or context this process does not know is
    # ``other`` (error records of another process's tree reach it as plain RollgymErrors).
    assert all(is_known_type(cause) and context in {"none", *ENDING_TYPES}
               for cause, context in watch.causes)  # fmt: skip
    assert "replica_down 3 (circuit_open 3)" in watch.status_line(None, None)
