"""Policy versions through the tool agent: the oldest version of a rollout's earlier calls sent
on each next call, a rollout surviving a pause that aborts its call, a stale rollout failing
with ``stale_rollout`` at its root, and a call held longer than the agent's model timeout by a
pause. Real model, env and agent servers on 127.0.0.1, rollouts run by the trainer client."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.config import RetryPolicy
from rollgym.errors import root_record
from rollgym.http import Target
from rollgym.server.agent import with_pause
from rollgym.trainer import RolloutClient
from rollgym.wire import (
    ABORTED_VERSIONS,
    PAUSE_ENDPOINT,
    POLICY_VERSION,
    RESUME_ENDPOINT,
    UPSTREAM_KEY,
)
from tests.models.held_model import TIMEOUT, HeldModel, post
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_a_rollout_survives_a_pause_that_aborts_its_call_and_records_both_versions() -> None:
    async with (
        running_stack(model=HeldModel) as stack,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        model = stack.model
        assert isinstance(model, HeldModel)
        model.free_calls = 1  # the first call answers; the second is held upstream
        model.go.clear()
        client = RolloutClient(stack.agent_url)
        rollout = asyncio.create_task(client.run(task_row(3), 3, 0, rollout_timeout=30))
        await wait_until(lambda: len(model.starts) == 2, what="the second call upstream")
        status, paused = await post(session, stack.urls["model"][0] + PAUSE_ENDPOINT,
                                    {"abort": True})  # fmt: skip
        assert (status, paused["aborted"], paused["held"]) == (200, 1, 1)
        model.go.set()
        await post(session, stack.urls["model"][0] + RESUME_ENDPOINT, {"version": 1})
        record = await rollout
    assert isinstance(record, ScoredRollout), record
    assert record.reward == 1.0
    assert record.policy_versions == (0, 1)
    entries = record.response[UPSTREAM_KEY]
    assert ABORTED_VERSIONS not in entries[0] and entries[1][ABORTED_VERSIONS] == [0]
    # The oldest version of the earlier calls went with each call after the first.
    assert model.oldest_headers == [None, "0", "0"]
    assert model.starts == [0, 0, 1]


async def test_a_stale_rollout_fails_with_stale_rollout_at_the_root_of_its_failure() -> None:
    async with (
        running_stack(model=HeldModel) as stack,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        model = stack.model
        assert isinstance(model, HeldModel)
        model.go.clear()  # the first call is held upstream, under version 0
        client = RolloutClient(stack.agent_url)
        rollout = asyncio.create_task(client.run(task_row(4), 4, 0, rollout_timeout=30))
        await wait_until(lambda: model.starts == [0], what="the first call upstream")
        # Meanwhile the trainer moved two versions on, and allows one.
        status, _ = await post(session, stack.urls["model"][0] + RESUME_ENDPOINT,
                               {"version": 2, "max_staleness": 1})  # fmt: skip
        assert status == 200
        model.go.set()
        record = await rollout
    assert isinstance(record, FailedRollout), record
    root = root_record(record.error.to_dict())
    assert (root["type"], root["status"], root["server"]) == ("stale_rollout", 409, "model")
    assert record.error.retryable is False  # not re-run as if the servers had failed
    assert model.starts == [0]  # the second call was refused before it ran
    assert model.oldest_headers == [None]
    assert stack.env.calls["verify"] == 0


async def test_a_call_held_by_a_pause_longer_than_the_model_timeout_still_succeeds() -> None:
    async with (
        running_stack(
            model=HeldModel, agent_options={"model_timeout": 0.5, "model_pause_s": 60}
        ) as stack,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        model_url = stack.urls["model"][0]
        await post(session, model_url + PAUSE_ENDPOINT, {"timeout_s": 60})
        client = RolloutClient(stack.agent_url)
        rollout = asyncio.create_task(client.run(task_row(5), 5, 0, rollout_timeout=30))
        await wait_until(lambda: stack.model.policy.held == 1, what="the first call held")
        await asyncio.sleep(0.8)  # held past model_timeout: only the pause allowance covers it
        await post(session, model_url + RESUME_ENDPOINT, {"version": 1})
        record = await rollout
    assert isinstance(record, ScoredRollout), record
    assert record.policy_versions == (1, 1)


def test_the_pause_allowance_lengthens_attempts_and_the_deadline_of_model_calls() -> None:
    policy = RetryPolicy.model_validate(
        {"attempt_timeout": 30, "deadline": 100,
         "endpoints": {"/v1/responses": {"attempt_timeout": 20}, "/x": {"max_attempts": 1}}}
    )  # fmt: skip
    target = with_pause(Target("model", ("http://m",), policy), 300)
    assert (target.policy.attempt_timeout, target.policy.deadline) == (330, 400)
    assert target.policy.endpoints["/v1/responses"].attempt_timeout == 320
    assert target.policy.endpoints["/x"].attempt_timeout is None
    assert with_pause(target, 0) is target


@pytest.mark.parametrize(
    ("response", "versions"),
    [
        ({UPSTREAM_KEY: [{POLICY_VERSION: 0}, {POLICY_VERSION: 2}]}, (0, 2)),
        ({UPSTREAM_KEY: {POLICY_VERSION: 4}}, (4,)),  # one call's answer returned as it is
        (
            {
                UPSTREAM_KEY: [
                    {"id": "x"},
                    None,
                    {POLICY_VERSION: True},
                    {POLICY_VERSION: -1},
                    {POLICY_VERSION: "3"},
                ]
            },
            (None,) * 5,
        ),
        ({}, ()),
        ({UPSTREAM_KEY: "junk"}, ()),
    ],
)
def test_a_records_policy_versions_are_read_from_its_upstream_entries(
    response: dict[str, object], versions: tuple[int | None, ...]
) -> None:
    record = ScoredRollout(0, 0, 1.0, 1, 0.1, {"response": response, "reward": 1.0})
    assert record.policy_versions == versions


async def test_a_pause_never_resumed_fails_the_rollout_as_paused_too_long_not_retried() -> None:
    async with (
        running_stack(model=HeldModel) as stack,
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        await post(session, stack.urls["model"][0] + PAUSE_ENDPOINT, {"timeout_s": 0.3})
        record = await RolloutClient(stack.agent_url).run(task_row(6), 6, 0, rollout_timeout=30)
        model = stack.model
        assert isinstance(model, HeldModel)
    assert isinstance(record, FailedRollout), record
    root = root_record(record.error.to_dict())
    assert (root["type"], root["server"]) == ("paused_too_long", "model")
    assert model.starts == []  # held, then failed: never sent again by the agent's retries
    assert model.policy.paused is False
