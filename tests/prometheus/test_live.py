"""The status line under the progress bar: failures by type, open circuits named (the
collector's own and, polled from their ``/stats``, the servers'), the slowest hops."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from rollgym.collect.live import RunWatch
from rollgym.collect.progress import RunProgress
from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.errors import HTTPStatusError, ReadTimeout
from tests.support.servers import FAIL_MARKER
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until

from .test_server_metrics import post

pytestmark = pytest.mark.timeout(60)


def scored(i: int, timing: Any) -> ScoredRollout:
    return ScoredRollout(i, 0, 1.0, 1, 0.5, {"reward": 1.0, "rollgym_timing": timing})


def test_the_status_names_failures_by_type_and_the_slowest_hops() -> None:
    watch = RunWatch(hops=True)
    watch(scored(0, {"model": [2.0, 4.0], "tool": [0.01], "verify": [0.2], "retries": {}}))
    watch(scored(1, {"model": [3.0], "seed": [0.001], "wait_s": 1.0, "total_s": 9.0}))
    for i in range(3):
        err = HTTPStatusError("boom", status=500, server="model")
        watch(FailedRollout(2 + i, 0, err, 1, 0.1))
    watch(FailedRollout(9, 0, ReadTimeout("slow", server="env"), 1, 0.1))
    line = watch.status_line(None, in_flight=7)
    assert "in flight 7" in line
    assert "http_status 3, read_timeout 1" in line
    assert "slowest hops: model 3.00s, verify 200ms, tool 10ms" in line
    assert "circuits closed" in line
    assert watch.failures[("http_status", "model")] == 3
    assert watch.seconds.count == 6


def test_an_agents_timing_cannot_break_the_status_or_grow_it() -> None:
    watch = RunWatch(hops=True)
    watch(scored(0, {"[bold red]": [1.0], "model": ["x", -1, None, 0.5], "tool": "nope"}))
    watch(scored(1, ["not", "a", "dict"]))
    watch(scored(2, {f"hop{i}": [0.1] for i in range(500)}))
    assert len(watch.hop_means()) <= 64
    line = watch.status_line(None, None)
    console = Console(file=io.StringIO(), force_terminal=True, width=400)
    # Markup in an agent's hop names is shown as text, never interpreted.
    from rich.text import Text

    console.print(Text.from_markup(line))
    assert "[bold red]" in Text.from_markup(line).plain
    assert watch.hop_means()["model"] == 0.5


def test_a_failed_error_type_from_another_process_is_escaped_too() -> None:
    watch = RunWatch()
    watch(FailedRollout(0, 0, HTTPStatusError("x", status=500, server="[/red]evil"), 1, 0.1))
    from rich.text import Text

    Text.from_markup(watch.status_line(None, None))  # no MarkupError


async def test_the_live_line_polls_the_servers_and_names_an_open_circuit() -> None:
    breaker = {"enabled": True, "consecutive_failures": 1, "cooldown": 60.0}
    async with running_stack(
        model_options={"fail_marker": FAIL_MARKER}, model_retry={"breaker": breaker}
    ) as stack:
        status, _ = await post(stack.agent_url + "/run", task_row(0, fail=True))
        assert status >= 500
        out = io.StringIO()
        progress = RunProgress(console=Console(file=out, force_terminal=True, width=300))
        progress.start(10)
        watch = RunWatch()
        watch.start_live(progress, None, stack.urls, lambda: 3)
        try:
            # Polled from the agent's /stats, set on the status line, drawn by the bar.
            await wait_until(lambda: "circuit open: agent->model" in out.getvalue(), 20)
        finally:
            await watch.stop_live()
            progress.stop()
    shown = out.getvalue()
    assert "circuit open: agent->model" in shown
    assert "in flight 3" in shown


def test_no_terminal_no_live_line() -> None:
    progress = RunProgress(console=Console(file=io.StringIO(), force_terminal=False))
    progress.start(1)
    try:
        assert not progress.watched
        watch = RunWatch()
        watch.start_live(progress, None, {"x": ["http://127.0.0.1:9"]}, lambda: None)
        assert watch._tasks == []
    finally:
        progress.stop()
