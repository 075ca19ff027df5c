"""The streaming trainer API (``rollgym.trainer.stream``) against real servers on 127.0.0.1: groups in
completion order, back-pressure, the failure rules, staleness judged on arrival, the pause
deadline, the run directory's ledger, and the sync form. Completion order is forced with gates
the test opens (never with timing); waits are bounded polls."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.responses import Response

from rollgym.collect.failure_budget import BudgetRules, FailureBudget, is_stale
from rollgym.errors import (
    HTTPStatusError,
    InputError,
    PausedTooLong,
    RunAborted,
    StaleRollout,
)
from rollgym.server.endpoint import Call
from rollgym.trainer import (
    FailedRollout,
    PolicyControl,
    RolloutClient,
    ScoredRollout,
    TaskGroup,
)
from rollgym.trainer.staleness import StalenessJudge
from rollgym.wire import POLICY_VERSION
from tests.support.background import in_thread
from tests.support.servers import FAIL_MARKER, FaultyModel
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

HOLD = "HOLD"
"""A row whose input carries ``HOLD<i>`` waits at each model call until gate ``i`` opens."""


def held_row(index: int, gate: int | None = None, *, fail: bool = False) -> dict[str, Any]:
    row = task_row(index, fail=fail)
    if gate is not None:
        params = row["responses_create_params"]
        params["input"] = f"{params['input']} {HOLD}{gate}"
    return row


class GateModel(FaultyModel):
    """The scripted model (a rollgym model server: its policy gate stamps every answer with
    the version it ran under) behind gates the test opens: a call of a row marked ``HOLD<i>``
    waits for gate ``i`` (only its model call number ``gate_turn``, counted from 1, when that
    is set), after the policy gate admitted it. Rollouts named in ``fail_once`` fail their
    first model call with a 500."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gates: dict[str, asyncio.Event] = {}
        self.waiting: Counter[str] = Counter()
        self.turns: Counter[str | None] = Counter()
        self.gate_turn: int | None = None
        self.fail_once: set[str] = set()

    def gate(self, i: int) -> asyncio.Event:
        return self.gates.setdefault(f"{HOLD}{i}", asyncio.Event())

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        if call.rollout in self.fail_once:
            self.fail_once.discard(call.rollout)
            return self._fault(500)
        self.turns[call.rollout] += 1
        text = orjson.dumps(params.get("input")).decode()
        if self.gate_turn is None or self.turns[call.rollout] == self.gate_turn:
            for marker, gate in list(self.gates.items()):
                if marker in text:
                    self.waiting[marker] += 1
                    await gate.wait()
        return await super().respond(params, call)


def ledger_keys(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    return [
        (r["task_index"], r["rollout_index"])
        for r in map(orjson.loads, path.read_bytes().splitlines())
    ]


def assert_ledger_exact(out: Path) -> dict[str, Any]:
    """Every dispatched rollout of ``tasks.jsonl`` has exactly one record in the three record
    files, and no record is of a rollout never dispatched."""
    tasks = ledger_keys(out / "tasks.jsonl")
    records = [
        *ledger_keys(out / "rollouts.jsonl"),
        *ledger_keys(out / "failures.jsonl"),
        *ledger_keys(out / "stale.jsonl"),
    ]
    assert len(tasks) == len(set(tasks)), "a rollout dispatched twice under one index"
    assert sorted(records) == sorted(tasks)
    info: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())
    return info


# -- completion order and back-pressure ---------------------------------------------------------


async def test_groups_arrive_in_completion_order_not_input_order() -> None:
    async with running_stack(model=GateModel) as stack, RolloutClient(stack.agent_url) as client:
        model = stack.model
        assert isinstance(model, GateModel)
        for i in range(3):
            model.gate(i)
        rows = [held_row(0, 0), held_row(1, 1), held_row(2, 2), held_row(3)]
        got: list[TaskGroup] = []
        async with client.stream(rows, repeats=2, concurrency=8) as stream:
            it = aiter(stream)
            got.append(await anext(it))  # the row no gate holds finishes first
            for i in (2, 0, 1):
                model.gate(i).set()
                got.append(await anext(it))
            with pytest.raises(StopAsyncIteration):
                await anext(it)
    assert [g.task_index for g in got] == [3, 2, 0, 1]
    assert [g.task for g in got] == [rows[3], rows[2], rows[0], rows[1]]
    for g in got:
        assert g.complete and g.rewards == [1.0, 1.0]
        assert [r.rollout_index for r in g.rollouts] == [0, 1]
    assert stream.stats.dispatched == stream.stats.scored == 8
    assert stream.in_flight == 0


async def test_rows_from_an_async_source_that_keeps_arriving() -> None:
    """Rows come from a queue the consumer fills after each group: the stream waits for them
    without ending, and ends when the source does."""
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def source() -> AsyncIterator[dict[str, Any]]:
        while (row := await queue.get()) is not None:
            yield row

    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        await queue.put(task_row(0))
        seen = []
        async with client.stream(source(), repeats=3, concurrency=4) as stream:
            async for group in stream:
                seen.append(group.task_index)
                assert group.rewards == [1.0] * 3
                await queue.put(task_row(len(seen)) if len(seen) < 4 else None)
    assert seen == [0, 1, 2, 3]


async def test_back_pressure_stops_dispatch_while_the_consumer_stalls() -> None:
    pulled = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for i in range(60):
            pulled += 1
            yield task_row(i)

    repeats, concurrency, max_ahead = 2, 4, 3
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        stream = client.stream(
            rows(), repeats=repeats, concurrency=concurrency, max_ahead=max_ahead
        )
        async with stream:
            # The consumer takes nothing: dispatch stops once max_ahead groups are started.
            await wait_until(
                lambda: stream.ready == max_ahead and stream.in_flight == 0, what="a stall"
            )
            stalled_at = bound = max_ahead
            assert pulled == stalled_at
            assert stream.stats.dispatched == stalled_at * repeats
            await asyncio.sleep(0.3)  # nothing moves while nobody consumes
            assert pulled == stalled_at and stream.in_flight == 0
            got = [g.task_index async for g in stream]
    assert sorted(got) == list(range(60))
    assert stream.stats.peak_ready <= bound and stream.stats.peak_open <= bound


async def test_a_bare_loop_left_by_break_closes_the_stream(tmp_path: Path) -> None:
    """Without ``async with``, leaving the loop closes the stream: its dispatcher and watchdog
    stop, its run directory says so, and no rollout is recorded twice."""
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        stream = client.stream(
            (task_row(i) for i in range(200)), repeats=2, concurrency=4, output=tmp_path / "run"
        )
        async for group in stream:
            assert group.complete
            break
        await wait_until(lambda: stream.closed, what="the stream to close")
        assert stream._task is not None and stream._task.done()
        assert stream._watchdog is not None and stream._watchdog.done()
        dispatched = stream.stats.dispatched
        await asyncio.sleep(0.2)
        assert stream.stats.dispatched == dispatched < 400  # nothing more was started
    info = assert_ledger_exact_or_unfinished(tmp_path / "run")
    assert info["status"] == "closed"


async def test_a_stream_that_ends_closes_itself_without_aclose(tmp_path: Path) -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        stream = client.stream([task_row(i) for i in range(3)], repeats=2, output=tmp_path / "r")
        it = aiter(stream)
        got = [await anext(it) for _ in range(3)]
        with pytest.raises(StopAsyncIteration):
            await anext(it)
        assert stream.closed  # the end released it: no aclose was called
        with pytest.raises(StopAsyncIteration):
            await anext(it)  # and it stays ended
    assert sorted(g.task_index for g in got) == [0, 1, 2]
    assert assert_ledger_exact(tmp_path / "r")["status"] == "completed"


async def test_a_streams_lines_name_the_fingerprint_of_the_environment_that_scored_them(
    tmp_path: Path,
) -> None:
    """The stream asks its agent once (the agent answers its resources server's fingerprint):
    run.json holds it, and every line, scored or failed, names it by id, as a run's lines do."""
    rows = [task_row(0), task_row(1, fail=True), task_row(2)]
    model_options = {"fail_marker": FAIL_MARKER}
    async with (
        running_stack(model_options=model_options) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        async with client.stream(rows, repeats=2, output=tmp_path / "run") as stream:
            assert len([g async for g in stream]) == 3
        expected = stack.env.fingerprint.to_dict()
    info = assert_ledger_exact(tmp_path / "run")
    assert info["fingerprints"] == {"agent": expected}
    lines = [
        orjson.loads(line)
        for name in ("rollouts.jsonl", "failures.jsonl")
        for line in (tmp_path / "run" / name).read_bytes().splitlines()
    ]
    assert len(lines) == 6 and any("error" in line for line in lines)
    assert {line["rollgym_fingerprint"] for line in lines} == {expected["id"]}


async def test_inside_async_with_a_finished_stream_still_pauses_and_is_released_on_exit() -> None:
    """A last weight swap after the last group: the pause holds the model server, and leaving
    the block releases it; a closed stream refuses to pause."""
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        gate = stack.model.policy
        control = PolicyControl(stack.urls["model"])
        stream = client.stream([task_row(i) for i in range(2)], repeats=2, control=control)
        async with stream:
            assert len([g async for g in stream]) == 2
            assert not stream.closed
            await stream.pause(timeout_s=30)
            assert gate.paused
        assert stream.closed and not gate.paused  # released by the block's end
        with pytest.raises(RuntimeError, match="closed stream"):
            await stream.pause()


async def test_inside_async_with_a_loop_may_stop_and_another_go_on() -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        async with client.stream([task_row(i) for i in range(6)], repeats=2) as stream:
            first = []
            async for group in stream:
                first.append(group.task_index)
                if len(first) == 2:
                    break  # a training step's worth
            assert not stream.closed
            rest = [g.task_index async for g in stream]
        assert stream.closed
    assert sorted(first + rest) == list(range(6))


async def test_a_consumer_that_stops_consuming_ends_the_stream_typed(tmp_path: Path) -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        rows = (task_row(i) for i in range(100))
        stream = client.stream(
            rows, repeats=2, concurrency=4, max_ahead=1, consumer_timeout=0.5,
            output=tmp_path / "run",
        )  # fmt: skip
        async with stream:
            await anext(aiter(stream))
            await wait_until(lambda: stream._feed.stopped, what="the consumer deadline")
            with pytest.raises(RunAborted, match="consumer took no group"):
                async for _ in stream:
                    pass
    info = assert_ledger_exact_or_unfinished(tmp_path / "run")
    assert info["status"] == "aborted" and "consumer" in info["abort_reason"]


def assert_ledger_exact_or_unfinished(out: Path) -> dict[str, Any]:
    """An aborted stream: no record twice, none of a rollout never dispatched, and run.json
    counts the dispatched rollouts left without one."""
    tasks = ledger_keys(out / "tasks.jsonl")
    records = [*ledger_keys(out / "rollouts.jsonl"), *ledger_keys(out / "failures.jsonl")]
    records += ledger_keys(out / "stale.jsonl")
    assert len(records) == len(set(records)) and set(records) <= set(tasks)
    info: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())
    assert info["counts"]["unfinished"] == len(tasks) - len(records)
    return info


# -- failure rules --------------------------------------------------------------------------------


def _failing_rows() -> list[dict[str, Any]]:
    return [task_row(0), task_row(1, fail=True), task_row(2)]


async def _collect(
    stack_options: dict[str, Any], rows: list[dict[str, Any]], **opts: Any
) -> tuple[list[TaskGroup], Any]:
    async with (
        running_stack(**stack_options) as stack,
        RolloutClient(stack.agent_url) as client,
        client.stream(rows, **opts) as stream,
    ):
        groups = [g async for g in stream]
    return groups, stream


FAILING = {"model_options": {"fail_marker": "FAIL"}}


async def test_rule_partial_yields_the_group_with_its_failures_typed() -> None:
    groups, stream = await _collect(FAILING, _failing_rows(), repeats=2, on_failure="partial")
    by_task = {g.task_index: g for g in groups}
    assert sorted(by_task) == [0, 1, 2]
    bad = by_task[1]
    assert not bad.complete and bad.rewards == [] and len(bad.failed) == 2
    for r in bad.failed:
        assert r.error.root().status == 500 and r.error.root().server == "model"
    assert by_task[0].complete and by_task[2].complete
    assert stream.stats.failed == 2 and stream.stats.reruns == 0


async def test_rule_drop_leaves_out_a_group_that_is_not_complete() -> None:
    groups, stream = await _collect(FAILING, _failing_rows(), repeats=2, on_failure="drop")
    assert sorted(g.task_index for g in groups) == [0, 2]
    assert stream.stats.groups_dropped == 1 and stream.stats.failed == 2


async def test_rule_rerun_replaces_a_failure_with_a_fresh_rollout_index(tmp_path: Path) -> None:
    async with running_stack(model=GateModel) as stack, RolloutClient(stack.agent_url) as client:
        assert isinstance(stack.model, GateModel)
        stack.model.fail_once = {"0:1"}  # the model fails rollout 0:1's first call, once
        rows = [task_row(0), task_row(1)]
        async with client.stream(
            rows, repeats=2, on_failure="rerun", output=tmp_path / "run",
            budget=None,
        ) as stream:  # fmt: skip
            groups = {g.task_index: g async for g in stream}
    first = groups[0]
    assert first.complete and first.rewards == [1.0, 1.0]
    assert [r.rollout_index for r in first.rollouts] == [0, 2]  # 2: the re-run of 1
    assert [(r.rollout_index, r.ok) for r in first.replaced] == [(1, False)]
    assert groups[1].complete and groups[1].replaced == ()
    assert stream.stats.reruns == 1 and stream.stats.dispatched == 5
    info = assert_ledger_exact(tmp_path / "run")
    assert info["status"] == "completed" and info["counts"]["unfinished"] == 0


async def test_rule_rerun_is_bounded_and_then_yields_the_failures() -> None:
    groups, stream = await _collect(
        FAILING, _failing_rows(), repeats=2, on_failure="rerun", max_reruns=3, budget=None
    )
    bad = next(g for g in groups if g.task_index == 1)
    # each of the 2 repeats: its first run and 3 re-runs, all failed
    assert len(bad.failed) == 2 and len(bad.replaced) == 6
    assert sorted(r.rollout_index for r in bad.rollouts + bad.replaced) == list(range(8))
    assert stream.stats.reruns == 6 and stream.stats.failed == 8


async def test_a_row_that_is_no_dict_fails_the_stream_with_an_input_error() -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        rows: list[Any] = [task_row(0), "not a row"]
        with pytest.raises(InputError, match=r"row 1 .* str"):
            async with client.stream(rows, repeats=1) as stream:
                async for _ in stream:
                    pass


# -- staleness ----------------------------------------------------------------------------------


async def test_a_stale_rollout_is_discarded_on_arrival_recorded_and_rerun(tmp_path: Path) -> None:
    """Row 0's last model call is admitted under version 0 and held; the trainer makes version
    2 live; with max_staleness 1 row 0's rollouts arrive stale: recorded as stale (not
    failures, not counted by the failure budget) and re-run under version 2."""
    async with running_stack(model=GateModel) as stack, RolloutClient(stack.agent_url) as client:
        model = stack.model
        assert isinstance(model, GateModel)
        model.gate_turn = 2  # the rollout's last model call: nothing after it can refuse it
        gate = model.gate(0)
        rows = [held_row(0, 0), task_row(1)]
        stream = client.stream(
            rows, repeats=2, max_staleness=1, output=tmp_path / "run",
            control=PolicyControl(stack.urls["model"]),
            # One failure would abort: stale rollouts must not count as failures.
            budget=_strict_budget(),
        )  # fmt: skip
        async with stream:
            it = aiter(stream)
            fresh = await anext(it)
            assert fresh.task_index == 1 and fresh.stale == []
            assert [r.policy_versions for r in fresh.scored] == [(0, 0), (0, 0)]
            await wait_until(lambda: model.waiting[f"{HOLD}0"] >= 2, what="row 0 held")
            await stream.resume(2)
            gate.set()
            late = await anext(it)
    assert late.task_index == 0 and late.complete and late.rewards == [1.0, 1.0]
    assert sorted(r.rollout_index for r in late.rollouts) == [2, 3]
    assert [r.policy_versions for r in late.scored] == [(2, 2), (2, 2)]
    assert len(late.replaced) == 2
    for r in late.replaced:
        assert isinstance(r, FailedRollout) and isinstance(r.error, StaleRollout)
        assert r.error.message.startswith("discarded")
        assert orjson.loads(r.error.body or "")["versions"] == [0, 0]
    assert late.failed == [] and late.stale == []
    assert stream.stats.stale == 2 and stream.stats.failed == 0
    assert_ledger_exact(tmp_path / "run")
    assert len(ledger_keys(tmp_path / "run" / "stale.jsonl")) == 2


async def test_a_stale_rollout_is_cancelled_in_flight_and_rerun(tmp_path: Path) -> None:
    """Row 0's first call ran under version 0; after version 2 is live (max_staleness 1) the
    model server refuses its next call (409 stale_rollout): the rollout ends at once, as a
    stale outcome, and is re-run."""
    async with running_stack(model=GateModel) as stack, RolloutClient(stack.agent_url) as client:
        model = stack.model
        assert isinstance(model, GateModel)
        model.gate_turn = 1
        gate = model.gate(0)
        stream = client.stream(
            [held_row(0, 0)], repeats=3, max_staleness=1, output=tmp_path / "run",
            control=PolicyControl(stack.urls["model"]), budget=_strict_budget(),
        )  # fmt: skip
        async with stream:
            await wait_until(lambda: model.waiting[f"{HOLD}0"] >= 3, what="row 0 held")
            await stream.resume(2)
            gate.set()
            groups = [g async for g in stream]
    (group,) = groups
    assert group.complete and len(group.replaced) == 3
    assert {r.policy_versions for r in group.scored} == {(2, 2)}
    for r in group.replaced:
        assert isinstance(r, FailedRollout)
        root = r.error.root()
        assert root.type == "stale_rollout" and root.status == 409 and root.server == "model"
    assert stream.stats.stale == 3 and stream.stats.failed == 0
    assert_ledger_exact(tmp_path / "run")


async def test_a_group_that_waited_across_a_resume_is_judged_again_as_it_leaves(
    tmp_path: Path,
) -> None:
    """A finished group waits in the buffer while the trainer makes version 1 live: with
    max_staleness 0 its rollouts (version 0) are no sample any more; they are re-run under
    version 1 before the trainer gets the group, and each is written once to the ledger."""
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        stream = client.stream(
            [task_row(0)], repeats=2, max_staleness=0, output=tmp_path / "run",
            control=PolicyControl(stack.urls["model"]), budget=_strict_budget(),
        )  # fmt: skip
        async with stream:
            await wait_until(lambda: stream.ready == 1, what="the group buffered")
            await stream.resume(1)
            groups = [g async for g in stream]
    (group,) = groups
    assert group.complete and [r.policy_versions for r in group.scored] == [(1, 1), (1, 1)]
    assert sorted(r.rollout_index for r in group.rollouts) == [2, 3]
    assert all(isinstance(r, FailedRollout) and is_stale(r.error) for r in group.replaced)
    assert stream.stats.stale == 2 and stream.stats.scored == 2
    assert_ledger_exact(tmp_path / "run")
    assert len(ledger_keys(tmp_path / "run" / "rollouts.jsonl")) == 2


async def test_stale_rollouts_kept_in_the_group_when_no_rerun_is_asked() -> None:
    async with running_stack(model=GateModel) as stack, RolloutClient(stack.agent_url) as client:
        model = stack.model
        assert isinstance(model, GateModel)
        model.gate_turn = 2
        gate = model.gate(0)
        stream = client.stream(
            [held_row(0, 0), task_row(1)], repeats=2, max_staleness=0, rerun_stale=False,
            on_failure="drop", budget=_strict_budget(),
        )  # fmt: skip
        async with stream:
            await wait_until(lambda: model.waiting[f"{HOLD}0"] >= 2, what="row 0 held")
            await stream.resume(1)  # no control: only the stream's judge knows the version
            gate.set()
            groups = [g async for g in stream]
    # drop: a group with stale rollouts is not complete, so it is dropped (and counted). Row 1
    # finished under version 0 before the resume (fresh on arrival), but waited in the buffer:
    # as it leaves, version 1 is live, so it is stale too.
    assert groups == [] and stream.stats.groups_dropped == 2 and stream.stats.stale == 4
    assert stream.stats.reruns == 0


def test_the_staleness_of_a_rollout_without_versions_is_never_guessed() -> None:
    judge = StalenessJudge(0, lambda: 5)
    unversioned = ScoredRollout(0, 0, 1.0, 1, 0.1, {"reward": 1.0, "response": {"output": []}})
    assert judge(unversioned) is unversioned and judge.unversioned == 1
    upstream = [{POLICY_VERSION: 5}, {POLICY_VERSION: 4}]
    old = ScoredRollout(
        0, 1, 1.0, 1, 0.1, {"reward": 1.0, "response": {"rollgym_upstream": upstream}}
    )
    got = judge(old)
    assert isinstance(got, FailedRollout) and isinstance(got.error, StaleRollout)
    assert is_stale(got.error) and (got.task_index, got.rollout_index) == (0, 1)
    assert got.cost is None  # it carried no cost: its spend stays unknown, never free
    spent = {"calls": 2, "input_tokens": 40, "output_tokens": 6}
    paid = ScoredRollout(0, 3, 1.0, 1, 0.1, {**old.verified, "rollgym_cost": spent})
    discarded = judge(paid)  # it ran in full: what it spent is waste, counted as such
    assert isinstance(discarded, FailedRollout) and discarded.cost == spent
    assert StalenessJudge(1, lambda: 5)(old) is old
    # Versions from the future (weights swapped without a resume) are said, not hidden.
    future = ScoredRollout(
        0, 2, 1.0, 1, 0.1, {"response": {"rollgym_upstream": [{POLICY_VERSION: 7}]}}
    )
    assert judge(future) is future and judge.ahead == 1
    # A version that is no version (a bool, a negative number) is none.
    bogus = [{POLICY_VERSION: True}, {POLICY_VERSION: -3}, {POLICY_VERSION: "9"}]
    odd = ScoredRollout(0, 3, 1.0, 1, 0.1, {"response": {"rollgym_upstream": bogus}})
    assert judge(odd) is odd and judge.unversioned == 2


def test_the_failure_budget_never_counts_a_stale_rollout() -> None:
    budget = FailureBudget(BudgetRules(max_failures=1, min_failure_samples=1))
    stale = StaleRollout("too old", server="collector")
    refused = HTTPStatusError(
        "stale", status=409, server="agent", origin=StaleRollout("x", status=409, server="model")
    )
    assert budget.observe(stale) is None and budget.observe(refused) is None
    assert budget.finished == 0 and budget.failed == 0
    assert budget.observe(HTTPStatusError("boom", status=500, server="model")) is not None


def _strict_budget() -> Any:
    return BudgetRules(max_failures=1, max_failure_rate=None)


# -- pause deadline -------------------------------------------------------------------------------


async def test_a_pause_never_resumed_ends_the_stream_with_paused_too_long(tmp_path: Path) -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        rows = (task_row(i) for i in range(50))
        stream = client.stream(rows, repeats=2, concurrency=4, output=tmp_path / "run")
        async with stream:
            await anext(aiter(stream))
            await stream.pause(timeout_s=0.5)
            with pytest.raises(PausedTooLong, match="without a resume"):
                async for _ in stream:
                    pass
    info = assert_ledger_exact_or_unfinished(tmp_path / "run")
    assert info["status"] == "aborted"


async def test_pause_holds_new_rollouts_and_resume_releases_them() -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        stream = client.stream((task_row(i) for i in range(6)), repeats=2, concurrency=2)
        async with stream:
            first = await anext(aiter(stream))
            calls = stack.env.calls
            seeded = calls["seed_session"]
            await stream.pause(timeout_s=30)
            # Only rollouts already past the gate when it closed may start now: at most the
            # concurrency (no model server is paused here, so they finish).
            await asyncio.sleep(0.5)
            assert calls["seed_session"] - seeded <= 2
            assert calls["seed_session"] < 12
            await stream.resume(1)
            rest = [g.task_index async for g in stream]
    assert stream.version == 1
    assert sorted([first.task_index, *rest]) == list(range(6))


# -- the sync form --------------------------------------------------------------------------------


def test_stream_sync_for_a_synchronous_trainer() -> None:
    with (
        in_thread(running_stack()) as stack,
        RolloutClient(stack.agent_url) as client,
        client.stream_sync([task_row(i) for i in range(4)], repeats=2) as stream,
    ):
        groups = list(stream)
    assert sorted(g.task_index for g in groups) == [0, 1, 2, 3]
    assert all(isinstance(r, ScoredRollout) for g in groups for r in g.rollouts)
