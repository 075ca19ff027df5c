"""The verifiers bridge's tool calls (``rollgym.integrations.verifiers.call_tool``: what
verifiers' MCP tool server runs for each call of the model) against a real resources server on
127.0.0.1, without verifiers: the state is a stand-in with ``RollgymState``'s fields, and each
call gets its own copy of it, as verifiers pulls the state before a call and writes it back."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.integrations.verifiers import call_tool, mcp_tools, rollout_episode
from rollgym.server.episode import MAX_TOOL_CALLS
from rollgym.testing import serve_server
from tests.support.servers import CountingEcho
from tests.support.stack import ECHO_TOOL

pytestmark = pytest.mark.timeout(60)

TASKSET = Path(__file__).parents[2] / "src/rollgym/integrations/verifiers_taskset.py"


@dataclass
class State:
    """The fields of ``verifiers_taskset.RollgymState`` (checked below against its source)."""

    resources_url: str
    server: str = "resources"
    rollout: str = "r0"
    session_id: str | None = None
    cookies: dict[str, str] = field(default_factory=dict)
    tool_timeout: float = 30.0
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[str] = field(default_factory=list)
    max_tool_calls: int = MAX_TOOL_CALLS
    tool_calls_taken: int = 0
    calls_spent: bool = False
    failure: dict[str, Any] | None = None


def test_the_stand_in_state_has_the_taskset_states_fields() -> None:
    # verifiers is opt-in (not in this venv): its module is read, not imported.
    tree = ast.parse(TASKSET.read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RollgymState"]
    declared = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)]  # type: ignore[union-attr]
    assert declared == [f.name for f in fields(State)]


async def _seeded(url: str, **kw: Any) -> State:
    """A rollout's state after the task's setup: seeded, the echo tool offered."""
    state = State(resources_url=url, tools=mcp_tools([ECHO_TOOL]), **kw)
    episode = rollout_episode(state)
    await episode.seed({"responses_create_params": {"input": "say v0"}})
    state.session_id, state.cookies = episode.session_id, dict(episode.cookies)
    return state


async def test_a_rollout_sends_at_most_max_tool_calls_through_verifiers_tools() -> None:
    # verifiers' chat loop has no tool-call cap: each call reached the environment.
    async with serve_server(CountingEcho, name="resources") as (url, env):
        assert isinstance(env, CountingEcho)
        state = await _seeded(url, max_tool_calls=5)
        answers = []
        for _ in range(8):
            state = copy.deepcopy(state)  # pulled and pushed whole around each call
            answers.append(await call_tool(state, "echo", {"text": "v0"}))
        sent = env.calls["echo"]
    assert sent == 5
    assert answers[:5] == [(orjson.dumps({"echo": "v0"}).decode(), False)] * 5
    spent = "not run: the rollout's 5 tool calls (max_tool_calls) are spent"
    assert answers[5:] == [(orjson.dumps({"error": spent}).decode(), True)] * 3
    # Marked, so the task's stop ends the rollout before its next model call.
    assert state.calls_spent is True and state.failure is None
    assert (state.tool_calls_taken, state.tool_calls) == (5, ["echo"] * 5)


async def test_a_rollout_under_its_cap_is_not_marked_spent() -> None:
    async with serve_server(CountingEcho, name="resources") as (url, env):
        assert isinstance(env, CountingEcho)
        state = await _seeded(url, max_tool_calls=2)
        for _ in range(2):
            assert (await call_tool(state, "echo", {"text": "v0"}))[1] is False
        assert env.calls["echo"] == 2
    assert state.calls_spent is False and state.tool_calls_taken == 2
