"""A model server frozen whole in the middle of a run (the vLLM-shaped double, a process of its
own, stops itself with SIGSTOP: the kernel still takes connections, nothing answers), through a
real ``rollgym run`` (200 rollouts at concurrency 64, and 40 at 4): agent -> ``openai_proxy`` ->
upstream.

The run ends by itself, its failures say what happened (the replica failed its liveness probe;
later calls were refused by its open breaker, which names that probe), no call went to the
frozen replica twice, and every rollout is recorded at most once. How long it takes after the
freeze is a figure of ``bench/freeze.py``, not an assertion here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from rollgym.errors import root_record
from tests.support.echo_run import write_echo_run
from tests.support.ledger import assert_recorded_once

pytestmark = pytest.mark.timeout(120)

DOUBLE = Path(__file__).with_name("vllm_double.py")
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def double_process(*args: str) -> Iterator[str]:
    """The double served by a process of its own; its URL."""
    proc = subprocess.Popen(
        [sys.executable, str(DOUBLE), *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)


def rollgym_run(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "run", str(config), "--output", str(out)],
        capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rollouts", "concurrency"),
    [
        (200, 64),  # the failures of the calls in flight trip the run's failure rate
        (40, 4),  # a few failures, then rollouts held by the open breaker: its hold limit
    ],
)
def test_a_model_server_frozen_mid_run_ends_the_run_naming_the_cause(
    tmp_path: Path, rollouts: int, concurrency: int
) -> None:
    # Frozen once half the model calls have come in (two per rollout).
    options = {"heartbeat": 0.3, "probe_timeout": 0.5}
    with double_process("--freeze-after", str(rollouts)) as upstream:
        config = write_echo_run(tmp_path, upstream, rollouts, concurrency, model_options=options)
        out = tmp_path / "out"
        done = rollgym_run(config, out)
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted", done.stderr[-3000:]
    assert done.returncode == run["exit_code"] != 0
    # The run's summary names the cause: the root error of its failures, and a sample.
    abort = run["abort"]
    assert set(abort["by_type"]) <= {"replica_down", "circuit_open"}, abort
    assert abort["by_server"].keys() == {"model.upstream"}
    assert "liveness probe (POST /ping: no answer within 0.5s)" in abort["sample_error"]["message"]
    # Counted by root cause: a call the open breaker refused counts as what opened it.
    assert abort["by_root"].keys() == {"replica_down"}, abort
    assert abort["by_root_context"].get("replica_down", {}).keys() <= {"circuit_open"}
    assert "by root cause: replica_down" in abort["reason"]
    assert re.search(r"failures\s+│ replica_down \d+", done.stdout), done.stdout
    metrics = orjson.loads((out / "metrics.json").read_bytes())["failures"]
    assert metrics["by_root"].keys() == {"replica_down"}, metrics

    ok, failures = assert_recorded_once(out)
    assert len(ok) + len(failures) < rollouts  # aborted: the rest is --resume's
    assert failures, "the calls in flight at the freeze fail, and are recorded"
    roots = [root_record(f["error"]) for f in failures]
    for root in roots:
        assert root["server"] == "model.upstream", root
        if root["type"] == "replica_down":
            # Failed by the heartbeat's probe, and not sent to the frozen replica again.
            assert "failed its liveness probe (POST /ping: no answer" in root["message"]
            assert root.get("attempts", 1) == 1  # the record leaves out one attempt
        else:
            # Refused by the replica's open breaker, which says what opened it.
            assert root["type"] == "circuit_open", root
            assert "POST /ping: no answer within 0.5s" in root["message"]
    assert "replica_down" in {root["type"] for root in roots}
