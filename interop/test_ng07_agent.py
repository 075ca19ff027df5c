"""NeMo Gym 0.7 drives rollgym's agent: its ``single_agent_turn`` Environment Server in front of
rollgym's ``tool_agent`` (agent sessions) and rollgym's ``lookup``, side by side with the same
Environment Server in front of 0.7's own ``simple_agent``; and 0.7's collector routing
materialized rows both there and to rollgym's agent registered as an Environment Server itself
(episode requests on its ``/run``).

Opt-in: skipped unless ``INTEROP07_VENV`` names the 0.7 venv (``interop/setup.sh --nemo 0.7``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from interop import nemo
from interop.conftest import Ng07Stacks
from interop.gym_eval import eval_run

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("INTEROP07_VENV"), reason="set INTEROP07_VENV to run 0.7's interop"
    ),
    pytest.mark.timeout(1500),
]

TASKSET, EPISODES = "lookup:turn", "lookup:episode"

LOOKUP_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a Norrowvale registry entry by key.",
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    },
    "strict": False,
}
SAY = "The registry lists Brackenholt with a population of 48,213."


def lookup_input(*, call: bool = True, broken: bool = False) -> dict[str, Any]:
    """A single_agent_turn task input: look Brackenholt up (or guess: 0.0, the env pays only
    answers that came from a lookup); ``broken``: a script the scripted model refuses (400),
    so the agent's turn fails."""
    script = [{"call": "lookup", "arguments": {"key": "Brackenholt"}}] if call else []
    script.append({"say": SAY})
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "How many people live in Brackenholt?"}],
            "tools": [LOOKUP_TOOL],
            # 0.7 validates metadata values as strings: the script travels as JSON text.
            "metadata": {"rollgym_script": "not json" if broken else json.dumps(script)},
        },
        "task_data": {"expected_answer": "48213"},
    }


def _direct_http(entry: dict[str, Any]) -> dict[str, Any]:
    """A ``single_agent_turn`` entry that grants its agent the resources' tools."""
    next(iter(entry[nemo.ENVIRONMENTS].values()))["resources_tool_transports"] = ["direct_http"]
    return entry


@pytest.fixture(scope="module")
def stack(ng07_stack: Ng07Stacks) -> nemo.GymStack:
    port = nemo.free_port
    config = {
        "lookup": nemo.rollgym_env(port(), "lookup"),
        "rollgym_lookup_agent": nemo.rollgym_agent(port(), "lookup"),
        "ng_lookup_agent": nemo.simple_agent(port(), "lookup"),
        "rollgym_turn": _direct_http(
            nemo.single_agent_turn(port(), "lookup", "rollgym_lookup_agent")
        ),
        "ng_turn": _direct_http(nemo.single_agent_turn(port(), "lookup", "ng_lookup_agent")),
        # rollgym's agent as an Environment Server: 0.7's collector posts episodes to its /run.
        "rollgym_episodes": nemo.rollgym_agent(port(), "lookup", kind=nemo.ENVIRONMENTS),
    }
    return ng07_stack(config, name="ng07_agent")


def episode(task_input: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": 0},
        "task": {"task_id": {"taskset": TASKSET, "task_id": rollout_id}, "task_input": task_input},
    }


def run(stack: nemo.GymStack, server: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = nemo.http_json(stack.urls[server] + "/run", body, timeout=120)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer


def test_single_agent_turn_pays_rollgyms_agent_what_it_pays_0_7s(stack: nemo.GymStack) -> None:
    for i, (call, reward) in enumerate([(True, 1.0), (False, 0.0)]):
        task_input = lookup_input(call=call)
        ours = run(stack, "rollgym_turn", episode(task_input, f"t{i}-0"))
        theirs = run(stack, "ng_turn", episode(task_input, f"t{i}-0"))
        flat = {**task_input["task_data"], "responses_create_params": task_input[
            "responses_create_params"]}  # fmt: skip
        direct = run(stack, "rollgym_lookup_agent", flat)
        assert ours["failure"] is None and theirs["failure"] is None, (ours, theirs)
        assert ours["episode_id"] == {"rollout_id": f"t{i}-0", "attempt": 0}
        mine, ref = ours["result"], theirs["result"]
        assert mine["reward"] == ref["reward"] == direct["reward"] == reward
        # The lookup ran in the episode's resources session, reached through the grant.
        assert mine["tool_called"] == ref["tool_called"] == int(call)
        assert mine["ng_agent_observations"] is None
        kinds = [item["type"] for item in mine["response"]["output"]]
        assert kinds == [item["type"] for item in ref["response"]["output"]]


def test_a_failing_turn_fails_at_the_agent_stage_on_both(stack: nemo.GymStack) -> None:
    body = episode(lookup_input(broken=True), "f0-0")
    ours, theirs = run(stack, "rollgym_turn", body), run(stack, "ng_turn", body)
    for answer in (ours, theirs):
        assert answer["result"] is None
        assert answer["failure"]["stage"] == "agent"
    # Ours says which server failed, where 0.7's agent says 500.
    assert ours["failure"]["terminal"] is theirs["failure"]["terminal"] is False
    assert "502" in ours["failure"]["failure_reason"]


def test_0_7s_collector_runs_materialized_rows_through_both_ways(
    stack: nemo.GymStack, tmp_path: Path
) -> None:
    inputs = [lookup_input(), lookup_input(call=False), lookup_input(broken=True)]
    rows = [
        {"task_id": {"taskset": taskset, "task_id": f"{taskset}-{i}"}, "task_input": task_input}
        for taskset in (TASKSET, EPISODES)
        for i, task_input in enumerate(inputs)
    ]
    # Hydra wants the taskset's colon escaped.
    routes = ", ".join(
        f"{taskset.replace(':', chr(92) + ':')}: {server}"
        for taskset, server in ((TASKSET, "rollgym_turn"), (EPISODES, "rollgym_episodes"))
    )
    routes = f"+environment_server_routes={{{routes}}}"
    result = eval_run(stack, rows, tmp_path / "run", routes, "+route_failures_to_sidecar=true")
    assert result.code == 0, result.output[-4000:]
    rewards = {
        (r["_ng_task_id"]["taskset"], r["_ng_task_id"]["task_id"]): r["reward"]
        for r in result.rollouts
    }
    assert rewards == {
        (TASKSET, f"{TASKSET}-0"): 1.0, (TASKSET, f"{TASKSET}-1"): 0.0,
        (EPISODES, f"{EPISODES}-0"): 1.0, (EPISODES, f"{EPISODES}-1"): 0.0,
    }  # fmt: skip
    assert {r["_ng_environment_server"] for r in result.rollouts} == {
        "rollgym_turn", "rollgym_episodes",
    }  # fmt: skip
    failures = result.failures
    assert len(failures) == 2
    for row in failures:
        assert row["_ng_failure_class"] == "environment_server_failed"
        assert row["_ng_failure_terminal"] is False
        assert row["_ng_failure_stage"] == "agent"
