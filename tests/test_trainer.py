"""The trainer API without Ray, against real servers on 127.0.0.1: records grouped by task,
failures as typed records, in-run retries, ``strict``, the sync forms, the failure budget and
the start check. (Records and errors crossing a Ray actor are tested in ``tests/ray``.)"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import orjson
import pytest
from starlette.responses import Response

from rollgym.errors import ConnectError, HTTPStatusError, LaunchError, RunAborted
from rollgym.protocol import output_text
from rollgym.server.endpoint import Call
from rollgym.trainer import (
    BudgetRules,
    FailedRollout,
    RolloutClient,
    ScoredRollout,
    collect_batch,
    collect_batch_sync,
)
from tests.support.background import in_thread
from tests.support.failures import assert_failed_groups, assert_model_failure
from tests.support.scripted import Reply, Script, serve_script
from tests.support.servers import FAIL_MARKER, FAULT_MESSAGE, FaultyModel
from tests.support.stack import Stack, running_stack, task_row

pytestmark = pytest.mark.timeout(60)

FAILING = {"fail_marker": FAIL_MARKER}
"""Model options: rows made with ``task_row(i, fail=True)`` fail with a 500, after 3 attempts."""

VERIFIED = orjson.dumps({"reward": 1.0, "response": {"output": []}})
"""What a scripted stand-in agent answers to ``/run``: the least a verified rollout holds."""


def rows(n: int, fail: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    return [task_row(i, fail=i in fail) for i in range(n)]


class TokenModel(FaultyModel):
    """Attaches each turn's usage and token-level fields, as the proxy does for vLLM."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.turns: Counter[str | None] = Counter()

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        response = await super().respond(params, call)
        assert isinstance(response, dict)
        self.turns[call.rollout] += 1
        response["rollgym_upstream"] = {"token_ids": [self.turns[call.rollout]] * 2}
        response["usage"]["output_tokens"] = 10
        response["usage"]["total_tokens"] = response["usage"]["input_tokens"] + 10
        return response


@pytest.fixture(scope="module")
def served() -> Iterator[Stack]:
    """A stack on a thread of its own (failing rows fail), for callers that block."""
    with in_thread(running_stack(model_options=FAILING)) as stack:
        yield stack


@pytest.fixture(scope="module")
def model_down() -> Iterator[Stack]:
    """A stack on a thread of its own whose model answers 503 to every call."""
    options = {"fail_status": 503, "down_for": 3600.0}
    with in_thread(running_stack(model_options=options)) as stack:
        yield stack


# -- results ----------------------------------------------------------------------------------


async def test_a_batch_comes_back_as_groups_of_scored_records_in_input_order() -> None:
    batch = [*rows(3), task_row(3, say="I do not know")]  # a real 0: scored, not failed
    sent = pickle.loads(pickle.dumps(batch))
    async with running_stack(model=TokenModel) as stack, RolloutClient(stack.agent_url) as client:
        groups = await client.collect(batch, repeats=3, concurrency=5)
        verified = stack.env.calls["verify"]
    assert batch == sent  # the caller's rows are not stamped in place
    assert [g.task_index for g in groups] == [0, 1, 2, 3]
    assert [g.task for g in groups] == batch
    assert [g.rewards for g in groups] == [[1.0] * 3, [1.0] * 3, [1.0] * 3, [0.0] * 3]
    assert verified == 12
    for group in groups:
        assert group.complete and group.failed == [] and len(group.scored) == 3
        assert [r.rollout_index for r in group.rollouts] == [0, 1, 2]
        for record in group.rollouts:
            assert isinstance(record, ScoredRollout)
            assert (record.task_index, record.attempts) == (group.task_index, 1)
            assert record.duration_s > 0
            # The whole verify response: the task's own fields, stamped with its indices.
            assert record.verified["expected_answer"] == f"v{group.task_index}"
            assert record.verified["task_index"] == group.task_index
            assert record.verified["rollout_index"] == record.rollout_index
            assert record.metrics["num_steps"] == 2.0
            assert "reward" not in record.metrics and "task_index" not in record.metrics
            response = record.response
            assert response is record.verified["response"]
            kinds = [item["type"] for item in response["output"]]
            assert kinds == ["function_call", "function_call_output", "message"]
            # Every turn's usage and token-level fields, not the last turn's only.
            assert response["usage"]["output_tokens"] == 20
            # Each call's entry, with the policy version and replica the model server adds.
            stamp = {"rollgym_policy_version": 0, "rollgym_replica": 0}
            assert response["rollgym_upstream"] == [
                {"token_ids": [1, 1], **stamp},
                {"token_ids": [2, 2], **stamp},
            ]
            assert record.policy_versions == (0, 0)
    assert f"v{groups[1].task_index}" in output_text(groups[1].scored[0].response)
    assert pickle.loads(pickle.dumps(groups)) == groups  # dataclass equality: types included


async def test_failures_are_typed_records_and_never_cancel_their_siblings() -> None:
    async with (
        running_stack(model_options=FAILING) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        groups = await client.collect(rows(6, fail={1, 4}), repeats=2)
        faults, verified = stack.model.faults, stack.env.calls["verify"]
    for group in groups:
        if group.task_index in (1, 4):
            assert group.rewards == []  # no reward at all, not zeros
            assert not group.complete and group.scored == []
            for record in group.failed:
                assert record.attempts == 1 and record.retryable is False
                assert_model_failure(record.error)
                assert FAULT_MESSAGE in record.error.root().message
        else:
            assert group.rewards == [1.0, 1.0] and group.complete
    assert faults == 4 * 3  # four failed rollouts, three model attempts each
    assert verified == 8  # a failed rollout is never scored
    failed = groups[1].rollouts[0]
    again = pickle.loads(pickle.dumps(failed))
    assert again == failed and type(again.error) is HTTPStatusError
    assert again.error.root().server == "model"


# -- retries, strict --------------------------------------------------------------------------


async def test_attempts_runs_a_rollout_again_only_after_a_retryable_failure() -> None:
    # A stand-in agent that is busy twice: its 503 is retryable, so the rollout runs again.
    busy = Script().plan("/run", [503, 503], default=Reply(200, VERIFIED))
    always_busy = Script().plan("/run", lambda n: 503)
    broken = Script().plan("/run", lambda n: 500)  # /run is not idempotent: final
    async with (
        serve_script(busy) as busy_url,
        serve_script(always_busy) as always_url,
        serve_script(broken) as broken_url,
    ):
        (group,) = await collect_batch([task_row(0)], agent=busy_url, attempts=3)
        (gone,) = await collect_batch([task_row(0)], agent=always_url, attempts=2)
        (bad,) = await collect_batch([task_row(0)], agent=broken_url, attempts=3)
    (scored,) = group.scored
    assert scored.reward == 1.0 and scored.attempts == 3 and busy.hits["/run"] == 3
    (failed,) = gone.failed
    assert failed.attempts == 2 and always_busy.hits["/run"] == 2
    assert isinstance(failed.error, HTTPStatusError) and failed.error.status == 503
    assert failed.retryable
    (final,) = bad.failed
    assert final.attempts == 1 and broken.hits["/run"] == 1 and not final.retryable

    # The agent's 502 for a model that failed all its own attempts is final: run once.
    async with (
        running_stack(model_options=FAILING) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        (group,) = await client.collect([task_row(0, fail=True)], attempts=3)
        assert stack.model.faults == 3
    (record,) = group.failed
    assert record.attempts == 1
    assert_model_failure(record.error)


async def test_strict_raises_the_first_failures_own_error_and_cancels_the_rest() -> None:
    slow = {**FAILING, "latency": 0.3}  # the failing rows fail at once, the others take 0.6 s
    # On a thread of their own, so that this loop runs the client's tasks only.
    with in_thread(running_stack(model_options=slow)) as stack:
        client = RolloutClient(stack.agent_url)
        try:
            with pytest.raises(HTTPStatusError) as caught:
                await collect_batch(rows(8, fail={0}), agent=client, repeats=4, strict=True)
            assert_model_failure(caught.value)
            # nothing is left running on the client's loop after the raise
            current = asyncio.current_task()
            assert [t for t in asyncio.all_tasks() if t is not current and not t.done()] == []
            await asyncio.sleep(1.0)  # time enough for a rollout left running to verify
            assert stack.env.calls["verify"] == 0  # every other rollout was cancelled
            # The client is still usable after a strict failure.
            (group,) = await client.collect([task_row(1)])
            assert group.rewards == [1.0]
        finally:
            await client.aclose()


# -- sync forms, reuse, one rollout -----------------------------------------------------------


def test_the_sync_api_from_plain_sync_code(served: Stack) -> None:
    groups = collect_batch_sync(rows(3, fail={2}), agent=served.agent_url, repeats=2)
    assert [g.rewards for g in groups] == [[1.0, 1.0], [1.0, 1.0], []]
    assert all(isinstance(r, FailedRollout) for r in groups[2].rollouts)
    with RolloutClient(served.agent_url) as client:
        (group,) = client.collect_sync([task_row(7)], repeats=3)
    assert group.task_index == 0 and group.rewards == [1.0] * 3
    assert group.scored[0].verified["expected_answer"] == "v7"


async def test_the_sync_api_inside_a_running_event_loop(served: Stack) -> None:
    # A trainer whose step is sync code called from async code: the batch runs on the
    # client's own loop thread, not on this (blocked) loop.
    with RolloutClient(served.agent_url) as client:
        (group,) = client.collect_sync([task_row(4)], repeats=2)
    assert group.rewards == [1.0, 1.0]
    (group,) = collect_batch_sync([task_row(5, fail=True)], agent=served.agent_url)
    assert_model_failure(group.failed[0].error)


def test_a_client_reused_across_batches_checks_the_agent_once_and_keeps_its_loop() -> None:
    agent = Script().plan("/run", lambda n: Reply(200, VERIFIED))
    with in_thread(serve_script(agent)) as url, RolloutClient(url) as client:
        for size in (1, 2, 3):
            groups = client.collect_sync(rows(size), repeats=2)
            assert [g.rewards for g in groups] == [[1.0, 1.0]] * size
        assert agent.hits["/health"] == 1  # one start check: the same loop and pool throughout
        assert agent.hits["/run"] == 12


async def test_a_client_reused_across_async_batches() -> None:
    async with (
        running_stack(model_options=FAILING) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        first = await client.collect(rows(2, fail={1}))
        stack.model.options.fail_marker = None  # the model is fixed between two steps
        second = await client.collect(rows(2, fail={1}))
        http = client.http()
        third = await client.collect(rows(1))
        assert client.http() is http
    assert [g.rewards for g in first] == [[1.0], []]
    assert [g.rewards for g in second] == [[1.0], [1.0]]
    assert [g.rewards for g in third] == [[1.0]]


async def test_run_makes_one_rollout_and_never_raises(dead_url: Callable[[], str]) -> None:
    async with (
        running_stack(model_options=FAILING) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        record = await client.run(task_row(5), 5, 2)
        failed = await client.run(task_row(6, fail=True), 6, 0)
        rollout_ids = set(stack.model.rollout_ids)
    assert isinstance(record, ScoredRollout)
    assert (record.task_index, record.rollout_index, record.reward) == (5, 2, 1.0)
    assert "5:2" in rollout_ids  # every server saw the rollout's key
    assert isinstance(failed, FailedRollout) and (failed.task_index, failed.attempts) == (6, 1)
    assert_model_failure(failed.error)
    async with RolloutClient(dead_url()) as client:
        gone = await client.run(task_row(0))
    assert isinstance(gone, FailedRollout) and isinstance(gone.error, ConnectError)


async def test_bad_batch_options_are_refused(dead_url: Callable[[], str]) -> None:
    async with RolloutClient(dead_url()) as client:
        for options in ({"repeats": 0}, {"concurrency": 0}, {"attempts": 0}):
            with pytest.raises(ValueError, match="at least 1"):
                await client.collect(rows(1), **options)  # type: ignore[arg-type]


# -- across processes -------------------------------------------------------------------------


def test_records_and_errors_cross_a_spawn_process(model_down: Stack) -> None:
    context = multiprocessing.get_context("spawn")
    agent = model_down.agent_url
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        groups = pool.submit(collect_batch_sync, rows(3), agent=agent, repeats=2)
        assert_failed_groups(groups.result(timeout=60), 3, 2, status=503)
        strict = pool.submit(collect_batch_sync, rows(3), agent=agent, strict=True)
        with pytest.raises(HTTPStatusError) as caught:
            strict.result(timeout=60)
    assert type(caught.value) is HTTPStatusError
    assert_model_failure(caught.value, 503)


def test_records_and_the_client_pickle(model_down: Stack) -> None:
    with RolloutClient(model_down.agent_url) as client:
        groups = client.collect_sync(rows(1), repeats=2)
        copy = pickle.loads(pickle.dumps(client))
        assert copy.target == client.target
    again = pickle.loads(pickle.dumps(groups))
    assert again == groups
    assert_failed_groups(again, 1, 2, status=503)


# -- the run's rules ---------------------------------------------------------------------------


async def test_a_404_among_the_first_rollouts_aborts_the_batch_with_its_summary() -> None:
    async with (
        running_stack(model_as="env") as stack,  # the agent's model is the env: 404
        RolloutClient(stack.agent_url) as client,
    ):
        with pytest.raises(RunAborted) as caught:
            await client.collect(rows(40), concurrency=4)
        seeded = stack.env.calls["seed_session"]
    err = caught.value
    assert err.message.startswith("batch aborted: configuration error") and "404" in err.message
    assert err.server == "agent"
    summary = orjson.loads(err.body or "{}")
    assert summary["by_server"] == {"model": 1} and summary["by_status"] == {"404": 1}
    assert seeded <= 4  # the rest of the batch was never sent
    assert pickle.loads(pickle.dumps(err)) == err


async def test_the_failure_budget_aborts_a_broken_batch_and_none_never_does() -> None:
    async with (
        running_stack(model_options=FAILING) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        broken = rows(60, fail=set(range(60)))
        with pytest.raises(RunAborted) as caught:
            await client.collect(broken, concurrency=2, budget=BudgetRules(max_failures=3))
        summary = orjson.loads(caught.value.body or "{}")
        assert "3 rollouts failed (--max-failures 3)" in caught.value.message
        assert summary["by_server"] == {"model": 3} and summary["by_status"] == {"500": 3}
        assert summary["sample_error"]["server"] == "model"
        assert FAULT_MESSAGE in summary["sample_error"]["body"]

        # With no budget every rollout ends as its record, however many fail.
        groups = await client.collect(broken, budget=None)
    assert len(groups) == 60 and all(len(g.failed) == 1 for g in groups)


async def test_an_agent_url_where_nothing_listens_is_a_launch_error(
    dead_url: Callable[[], str],
) -> None:
    url = dead_url()
    async with RolloutClient(url) as client:
        with pytest.raises(LaunchError, match=r"agent at http://127\.0\.0\.1:\d+") as caught:
            await client.collect(rows(2))
    assert url in caught.value.message
    assert pickle.loads(pickle.dumps(caught.value)) == caught.value
    with pytest.raises(LaunchError):
        collect_batch_sync(rows(1), agent=[url])
