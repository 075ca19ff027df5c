"""rollgym's tool agent drives NeMo Gym's own example servers, and scores as NeMo Gym's
``simple_agent`` does on the same model outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interop.conftest import Stacks
from interop.rollouts import example_rows, nemo_agent_rewards, rollgym_rewards, run_log, scripted

pytestmark = pytest.mark.timeout(600)


def weather_rows() -> list[dict]:
    rows = example_rows("example_single_tool_call")
    script = [{"call": "get_weather", "arguments": {"city": "SF"}}, {"say": "{tool_output}"}]
    return [scripted(row, script) for row in rows]


def counter_rows() -> list[dict]:
    """Each example row twice: adding what its prompt says (reward 1) and adding one too many
    (reward 0). The count lives in the server's session, seeded from ``initial_count``: a
    rollout that loses its session cookie scores 0 either way."""
    rows = []
    for row in example_rows("example_session_state_mgmt"):
        need = row["expected_count"] - row["initial_count"]
        for extra in (0, 1):
            script = [
                {"call": "increment_counter", "arguments": {"count": need - 1}},
                {"call": "increment_counter", "arguments": {"count": 1 + extra}},
                {"call": "get_counter_value", "arguments": {}},
                {"say": "The count is {tool_output}"},
            ]
            rows.append(scripted(row, script))
    return rows


def test_rollgym_agent_drives_example_single_tool_call(stacks: Stacks, out: Path) -> None:
    rows = weather_rows()
    env = stacks.nemo["example_single_tool_call"]
    code, rollouts = rollgym_rewards(stacks.rollgym["model"], env, rows, out)
    assert code == 0, run_log(out)
    for rollout in rollouts:
        assert rollout is not None and rollout["reward"] == 1.0
        outputs = [i for i in rollout["response"]["output"] if i["type"] == "function_call_output"]
        # The tool really ran on NeMo Gym's server: its answer is in the rollout.
        assert "The weather in SF is cold." in outputs[0]["output"]
    nemo = nemo_agent_rewards(stacks.nemo["example_single_tool_call_simple_agent"], rows)
    assert nemo == [(200, r["reward"]) for r in rollouts]  # type: ignore[index]


def test_rollgym_agent_keeps_nemo_session_state(stacks: Stacks, out: Path) -> None:
    rows = counter_rows()
    env = stacks.nemo["example_session_state_mgmt"]
    code, rollouts = rollgym_rewards(stacks.rollgym["model"], env, rows, out)
    assert code == 0, run_log(out)
    rewards = [r["reward"] for r in rollouts]  # type: ignore[index]
    assert rewards == [1.0, 0.0] * (len(rows) // 2)
    last = rollouts[0]["response"]["output"][-2]  # type: ignore[index]
    assert json.loads(last["output"]) == {"count": rows[0]["expected_count"]}
    nemo = nemo_agent_rewards(stacks.nemo["example_session_state_mgmt_simple_agent"], rows)
    assert nemo == [(200, r) for r in rewards]
