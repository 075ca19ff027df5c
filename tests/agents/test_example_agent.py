"""The README's example agent, run for real against the scripted model and the echo env."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rollgym.config import RetryPolicy
from rollgym.http import Target
from rollgym.protocol import function_calls
from rollgym.server.agent import AgentServer, RunContext
from rollgym.testing import serve_server
from tests.agents.test_tool_agent import post_run


class AskOnce(AgentServer):
    """Ask the model once, then verify its answer: the smallest useful agent."""

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        episode = ctx.episode()  # this rollout's session on the resources server
        await episode.seed(row)
        response = await ctx.respond(row["responses_create_params"])
        return await episode.verify(row, response)


pytestmark = pytest.mark.timeout(30)


async def run_once(agent: type[AgentServer], row: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One ``/run`` of ``row`` by ``agent``, against the scripted model and the echo env."""
    policy = RetryPolicy(max_attempts=1)
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server("echo", name="resources") as (env_url, _),
        serve_server(
            agent,
            name="agent",
            peers={
                "model": Target.single("model", model_url, policy),
                "resources": Target.single("resources", env_url, policy),
            },
        ) as (agent_url, _),
    ):
        return await post_run(agent_url, row, headers={"x-rollgym-rollout": "0:0"})


@pytest.mark.parametrize(("said", "reward"), [("It is 42.", 1.0), ("No idea.", 0.0)])
async def test_the_example_agent_runs_a_verified_rollout(said: str, reward: float) -> None:
    script = [{"say": said}]
    row = {
        "responses_create_params": {"input": "6 x 7?", "metadata": {"rollgym_script": script}},
        "expected_answer": "42",
    }
    status, body = await run_once(AskOnce, row)
    assert status == 200, body
    assert body["reward"] == reward
    assert body["expected_answer"] == "42"
    assert body["response"]["output"][0]["content"][0]["text"] == said


class ToolLoop(AgentServer):
    """The README's tool-calling agent: model -> tools -> model ... -> verify."""

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        episode = ctx.episode()
        await episode.seed(row)
        params = dict(row["responses_create_params"])
        params["tools"] = params.get("tools") or await episode.tools()
        prompt = params["input"]
        items = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        outputs: list[dict[str, Any]] = []
        for _ in range(8):  # at most 8 model calls
            response = await ctx.respond({**params, "input": items + outputs})
            outputs += response["output"]
            calls = function_calls(response)
            if not calls:
                break
            for call in calls:
                output = await episode.call_tool(call["name"], orjson.loads(call["arguments"]))
                outputs.append(
                    {"type": "function_call_output", "call_id": call["call_id"], "output": output}
                )
        return await episode.verify(row, {**response, "output": outputs})


async def test_the_readme_tool_loop_agent_uses_the_tools_and_is_verified() -> None:
    script = [{"call": "echo", "arguments": {"text": "v7"}}, {"say": "It is {tool_output}"}]
    row = {
        "responses_create_params": {"input": "task 7", "metadata": {"rollgym_script": script}},
        "expected_answer": "v7",
    }
    status, body = await run_once(ToolLoop, row)
    assert status == 200, body
    assert body["reward"] == 1.0
    kinds = [item["type"] for item in body["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"], kinds
