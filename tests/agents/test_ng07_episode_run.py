"""An agent's ``POST /run`` takes NeMo Gym 0.7 episode requests: the same rollout as a flat row,
answered ``{episode_id, task_id, result | failure}`` (200 either way), a malformed one 422."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from rollgym.nemo_gym.agent_episodes import MAX_ID_CHARS
from rollgym.wire import HEADER_ROLLOUT
from tests.agents.ng07_stack import episode, lookup_row, mcqa_row, ng07_stack, post
from tests.support.servers import FAIL_MARKER

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("agent", "row"), [("agent", lookup_row()), ("mcqa_agent", mcqa_row())])
async def test_an_episode_gets_the_reward_the_flat_row_gets(
    agent: str, row: dict[str, Any]
) -> None:
    async with ng07_stack() as stack:
        url = stack.urls[agent] + "/run"
        flat_status, flat, _, _ = await post(url, row)
        status, answer, cookies, headers = await post(url, episode(row, "3-1"))
    assert flat_status == 200 and status == 200, answer
    assert flat["reward"] == 1.0
    assert set(answer) == {"episode_id", "task_id", "result", "failure"}
    assert answer["episode_id"] == {"rollout_id": "3-1", "attempt": 0}
    assert answer["task_id"] == {"taskset": "lookup:t", "task_id": "t0"}
    assert answer["failure"] is None
    result = answer["result"]
    assert result["reward"] == flat["reward"]
    # The verify response as the flat /run answers it: task fields, metrics; the agent's own
    # numbers under _rollgym_agent, which 0.7's aggregate metrics skip (a leading "_").
    assert {k: result[k] for k in row} == {k: flat[k] for k in row}
    assert "rollgym_timing" in result
    own = result["_rollgym_agent"]
    assert set(own) == {"num_steps", "truncated", "agent_seconds", "drifted_turns"} & set(flat)
    assert own["num_steps"] == flat["num_steps"] and own["truncated"] == flat["truncated"]
    assert not set(own) & set(result)
    Response.model_validate(result["response"])
    assert headers[HEADER_ROLLOUT] == "3-1"
    assert cookies == {}  # an environment server sets no cookie


async def test_the_tool_is_called_in_the_episodes_own_session() -> None:
    async with ng07_stack() as stack:
        _, answer, _, _ = await post(stack.urls["agent"] + "/run", episode(lookup_row()))
    assert answer["result"]["tool_called"] == 1 and answer["result"]["reward"] == 1.0


async def test_flat_task_input_fields_merge_into_task_data_as_in_0_7() -> None:
    body = episode(lookup_row())
    task_input = body["task"]["task_input"]
    task_input["expected_answer"] = task_input.pop("task_data")["expected_answer"]
    async with ng07_stack() as stack:
        status, answer, _, _ = await post(stack.urls["agent"] + "/run", body)
    assert status == 200 and answer["result"]["reward"] == 1.0, answer
    assert answer["result"]["expected_answer"] == "48213"


async def test_the_rollout_id_is_the_episodes_capture_key() -> None:
    async with ng07_stack() as stack:
        url = stack.urls["agent"] + "/run"
        _, first, _, h0 = await post(url, episode(lookup_row(), "r-9", attempt=0))
        _, again, _, h2 = await post(url, episode(lookup_row(), "r-9", attempt=2))
        seen = list(stack.model.rollout_ids)
    assert h0[HEADER_ROLLOUT] == "r-9" and h2[HEADER_ROLLOUT] == "r-9-a2"
    # Every model call of an attempt carries its key; attempt 2 is a rollout of its own.
    assert seen == ["r-9", "r-9", "r-9-a2", "r-9-a2"]
    assert again["episode_id"] == {"rollout_id": "r-9", "attempt": 2}
    assert first["result"]["reward"] == again["result"]["reward"] == 1.0


async def test_a_failing_model_is_a_200_with_a_failure_at_the_agent_stage() -> None:
    async with ng07_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        status, answer, _, _ = await post(
            stack.urls["agent"] + "/run", episode(lookup_row(fail=True))
        )
        faults = stack.model.faults
    assert status == 200, answer
    assert answer["result"] is None
    failure = answer["failure"]
    assert failure["stage"] == "agent"
    assert failure["terminal"] is False  # a model's 500: another attempt may succeed
    assert isinstance(failure["failure_reason"], str) and failure["failure_reason"]
    assert faults == 3  # the model's own retries ran first


@pytest.mark.parametrize(("fail_at", "stage"), [("seed", "seed"), ("verify", "verification")])
async def test_a_failing_resources_server_fails_at_the_stage_it_failed(
    fail_at: str, stage: str
) -> None:
    async with ng07_stack(lookup_options={"fail_at": fail_at}) as stack:
        status, answer, _, _ = await post(stack.urls["agent"] + "/run", episode(lookup_row()))
    assert status == 200, answer
    assert answer["result"] is None and answer["failure"]["stage"] == stage


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node[key]
    if value is _DROP:
        del node[last]
    else:
        node[last] = value
    return body


_DROP = object()
HUGE = "x" * (MAX_ID_CHARS + 1)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("episode_id.rollout_id", HUGE, "episode_id.rollout_id"),
        ("task.task_id.task_id", HUGE, "task.task_id.task_id"),
        ("task.task_id.taskset", "y" * 100_000, "task.task_id.taskset"),
        ("episode_id.rollout_id", "has space", "episode_id.rollout_id"),
        ("episode_id.rollout_id", "-leading-dash", "episode_id.rollout_id"),
        ("episode_id.rollout_id", "3-1-a2", "attempt suffix"),
        ("episode_id.rollout_id", "", "episode_id.rollout_id"),
        ("episode_id.attempt", -1, "episode_id.attempt"),
        ("task.task_id.task_id", 5, "task.task_id.task_id"),
        ("task.task_input.expected_answer", "17", "conflicting task field 'expected_answer'"),
        ("task.task_input.task_data", [1, 2], "task_data"),
        ("task.task_input.responses_create_params", _DROP, "responses_create_params"),
        ("task.task_input.responses_create_params.input", _DROP, "responses_create_params.input"),
        ("task", _DROP, "task"),
        ("episode_id.extra", 1, "episode_id.extra"),
        ("surprise", 1, "surprise"),
    ],
)
async def test_a_malformed_episode_is_a_422_naming_the_field(
    path: str, value: Any, named: str
) -> None:
    body = _with(episode(lookup_row()), path, value)
    async with ng07_stack() as stack:
        status, answer, _, _ = await post(stack.urls["agent"] + "/run", body)
        calls = stack.model.requests
    assert status == 422, answer
    assert named in answer["error"]["message"]
    assert len(answer["error"]["message"]) < 2000  # a huge id is named, not echoed whole
    assert calls == 0


async def test_a_late_attempt_of_a_long_id_is_refused_before_it_runs() -> None:
    body = episode(lookup_row(), "x" * MAX_ID_CHARS, attempt=3)  # its capture key is too long
    async with ng07_stack() as stack:
        status, answer, _, _ = await post(stack.urls["agent"] + "/run", body)
        calls = stack.model.requests
    assert status == 422 and "episode_id.rollout_id" in answer["error"]["message"]
    assert calls == 0


async def test_a_flat_row_still_gets_the_flat_answer() -> None:
    async with ng07_stack() as stack:
        status, body, _, _ = await post(stack.urls["agent"] + "/run", lookup_row())
    assert status == 200 and body["reward"] == 1.0
    assert "episode_id" not in body and "result" not in body
