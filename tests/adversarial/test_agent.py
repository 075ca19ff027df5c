"""Red team: tool calls a policy under training may emit. Each one goes back to the model as a
tool error (``function_call_output`` saying what was wrong) and the rollout is verified as
usual; none reaches an endpoint it must not, and none makes the agent answer 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from rollgym.agents.tool_agent import ToolAgent, unsent_calls
from rollgym.http import HttpClient, Target
from rollgym.reverify import replay_tools
from rollgym.server.episode import ResourcesClient
from tests.agents.test_tool_agent import post_run
from tests.report.runs import collect
from tests.support.ledger import read_jsonl
from tests.support.servers import CountingEcho
from tests.support.stack import ECHO_TOOL, running_stack, task_row

pytestmark = pytest.mark.timeout(60)

DEEP = '{"text": ' + "[" * 300 + "]" * 300 + "}"  # orjson reads 1,024 levels, writes 255


def _tool_errors(body: dict[str, Any]) -> list[str]:
    outputs = [o for o in body["response"]["output"] if o["type"] == "function_call_output"]
    return [orjson.loads(o["output"]).get("error", "") for o in outputs]


async def _healthy(url: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url + "/health") as resp:
        return resp.status == 200


def _calling(arguments: Any, name: str = "echo") -> dict[str, Any]:
    turns = [{"call": name, "arguments": arguments}, {"say": "The answer is v0"}]
    return task_row(0, turns=turns)


async def test_arguments_nested_300_deep_are_a_tool_error_not_a_500() -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling(DEEP))
        assert await _healthy(stack.agent_url)
        assert stack.env.calls["echo"] == 0  # never sent
    assert status == 200, body
    [error] = _tool_errors(body)
    assert "cannot be passed on as JSON" in error
    assert body["reward"] == 1.0  # the rollout went on and was verified as usual


async def test_arguments_past_the_size_limit_are_a_tool_error() -> None:
    big = orjson.dumps({"text": "x" * 5000}).decode()
    async with running_stack(agent_options={"max_tool_argument_bytes": 1000}) as stack:
        status, body = await post_run(stack.agent_url, _calling(big))
        assert stack.env.calls["echo"] == 0
    assert status == 200, body
    [error] = _tool_errors(body)
    assert "exceed the 1000 allowed" in error


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        # Already answered as tool errors before this suite; kept so they stay so.
        ('{"text": NaN}', "not valid JSON"),
        ('{"text": 1e400}', "not valid JSON"),
        ('{"text": "\\ud800"}', "not valid JSON"),  # a lone surrogate
        ('{"text": "unterminated', "not valid JSON"),
        ("[" * 2000 + "]" * 2000, "not valid JSON"),  # past orjson's 1,024 levels
        ('["a", "list"]', "must be a JSON object"),
        ("42", "must be a JSON object"),
    ],
)
async def test_unusable_arguments_are_tool_errors(arguments: str, says: str) -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling(arguments))
        assert stack.env.calls["echo"] == 0
    assert status == 200, body
    [error] = _tool_errors(body)
    assert says in error


@pytest.mark.parametrize(
    "name", ["verify", "seed_session", "stats", "aggregate_metrics", "tools", "health", "nope"]
)
async def test_a_tool_that_is_not_declared_never_reaches_the_server(name: str) -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling({}, name))
        assert stack.env.calls["verify"] == 1 and stack.env.calls["seed_session"] == 1
    assert status == 200, body
    assert _tool_errors(body) == [f"unknown tool {name!r}"]


@pytest.mark.parametrize("name", ["verify", "seed_session", "stats", "aggregate_metrics"])
async def test_a_reserved_endpoint_stays_unreachable_even_when_a_row_declares_it(
    name: str,
) -> None:
    row = _calling({"expected_answer": "x", "response": {"output": []}}, name)
    row["responses_create_params"]["tools"] = [ECHO_TOOL, {**ECHO_TOOL, "name": name}]
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, row)
        assert stack.env.calls["verify"] == 1 and stack.env.calls["seed_session"] == 1
    assert status == 200, body
    assert _tool_errors(body) == [f"unknown tool {name!r}"]
    assert body["reward"] == 1.0


class Watching(CountingEcho):
    """The counting echo env that also counts every request for a path it does not serve:
    whatever the agent sends, the env sees it."""

    def routes(self) -> list[BaseRoute]:
        return [*super().routes(), Route("/{path:path}", self._elsewhere, methods=["GET", "POST"])]

    async def _elsewhere(self, request: Request) -> Response:
        self.calls[request.url.path] += 1
        return JSONResponse({"error": {"message": "not found"}}, status_code=404)


def _echo_calls(n: int) -> list[dict[str, Any]]:
    return [{"name": "echo", "arguments": {"text": "v0"}}] * n


def _past(n: int) -> str:
    return f"not run: a message may make at most {n} tool calls (max_tool_calls_per_message)"


async def test_ten_thousand_calls_in_one_message_send_64_and_the_rollout_is_recorded(
    tmp_path: Path,
) -> None:
    row = task_row(0, turns=[{"calls": _echo_calls(10_000)}, {"say": "The answer is v0"}])
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(orjson.dumps(row) + b"\n")
    async with running_stack(env=Watching) as stack:
        await collect(stack, tasks, tmp_path / "out")
        sent = dict(stack.env.calls)
    assert sent == {"seed_session": 1, "echo": 64, "verify": 1}
    [record] = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    errors = _tool_errors(record)
    assert len(errors) == 10_000  # every call has its output, in order
    assert errors[:64] == [""] * 64 and errors[64:] == [_past(64)] * 9_936
    assert record["reward"] == 1.0 and record["num_steps"] == 2
    assert record["truncated"] is False  # the cap per message lets the model go on


async def test_the_rollout_cap_holds_across_messages_and_ends_the_rollout_truncated() -> None:
    turns = [{"calls": _echo_calls(3)}, {"calls": _echo_calls(3)}, {"say": "The answer is v0"}]
    options = {"max_tool_calls_per_message": 3, "max_tool_calls": 5}
    async with running_stack(env=Watching, agent_options=options) as stack:
        status, body = await post_run(stack.agent_url, task_row(0, turns=turns))
        sent = dict(stack.env.calls)
    assert status == 200, body
    assert sent == {"seed_session": 1, "echo": 5, "verify": 1}
    spent = "not run: the rollout's 5 tool calls (max_tool_calls) are spent"
    assert _tool_errors(body) == [""] * 5 + [spent]
    # Ended where the calls ran out, as max_steps ends a rollout: the third turn never came.
    assert body["num_steps"] == 2 and body["truncated"] is True
    assert body["reward"] == 0.0


async def test_a_replay_of_a_capped_rollout_sends_only_what_the_agent_sent() -> None:
    # ``rollgym reverify`` calls a rollout's tools again before verifying it: the calls the
    # agent left unsent must stay unsent, or the session it verifies against differs.
    row = task_row(0, turns=[{"calls": _echo_calls(10)}, {"say": "The answer is v0"}])
    options = {"max_tool_calls_per_message": 4}
    async with running_stack(env=Watching, agent_options=options) as stack:
        status, body = await post_run(stack.agent_url, row)
        assert stack.env.calls["echo"] == 4
        client = HttpClient()
        try:
            resources = ResourcesClient(client, Target.single("env", stack.urls["env"][0]))
            await replay_tools(resources.episode("replay"), row, body["response"])
        finally:
            await client.close()
        assert stack.env.calls["echo"] == 8  # 4 more, not 10
    assert status == 200, body


async def test_a_replay_sends_the_sent_one_of_two_calls_sharing_an_id() -> None:
    # A model may give two calls one id: the first sent, the second past the cap. Keyed by
    # call_id, a replay left out both, and verified against a session that lacked the first.
    row = task_row(0, turns=[{"calls": _echo_calls(2)}, {"say": "The answer is v0"}])
    options = {"max_tool_calls_per_message": 1}
    async with running_stack(env=Watching, agent_options=options) as stack:
        status, body = await post_run(stack.agent_url, row)
        assert status == 200, body
        assert stack.env.calls["echo"] == 1
        response = body["response"]
        for item in response["output"]:  # the model's two calls, one id
            if item["type"] in ("function_call", "function_call_output"):
                item["call_id"] = "call_same"
        assert _tool_errors(body) == ["", _past(1)]
        assert unsent_calls(response) == {1}  # the second call, by its place
        client = HttpClient()
        try:
            resources = ResourcesClient(client, Target.single("env", stack.urls["env"][0]))
            await replay_tools(resources.episode("replay"), row, response)
        finally:
            await client.close()
        assert stack.env.calls["echo"] == 2  # the sent one again, not the unsent one


def test_unsent_calls_pairs_each_output_with_the_earliest_open_call_of_its_id() -> None:
    def call(call_id: str) -> dict[str, Any]:
        return {"type": "function_call", "call_id": call_id, "name": "echo", "arguments": "{}"}

    def answer(call_id: str, error: str | None) -> dict[str, Any]:
        output = orjson.dumps({"error": error} if error else {"echo": "v0"}).decode()
        return {"type": "function_call_output", "call_id": call_id, "output": output}

    output = [
        call("a"), call("a"), call("b"), answer("a", None), answer("a", _past(1)),
        answer("b", _past(1)), call("a"), answer("a", "a tool's own refusal"),
        {"type": "message", "role": "assistant", "content": []},
    ]  # fmt: skip
    assert unsent_calls({"output": output}) == {1, 2}


async def test_a_rollout_that_spends_its_calls_exactly_may_still_answer() -> None:
    turns = [{"calls": _echo_calls(3)}, {"calls": _echo_calls(2)}, {"say": "The answer is v0"}]
    options = {"max_tool_calls_per_message": 3, "max_tool_calls": 5}
    async with running_stack(env=Watching, agent_options=options) as stack:
        status, body = await post_run(stack.agent_url, task_row(0, turns=turns))
        assert stack.env.calls["echo"] == 5
    assert status == 200, body
    assert _tool_errors(body) == [""] * 5
    assert body["num_steps"] == 3 and body["truncated"] is False and body["reward"] == 1.0


async def test_an_agent_session_turn_obeys_the_caps_too() -> None:
    # NeMo Gym 0.7's agent sessions run the same loop, unverified (``ToolAgent.turn``).
    options = {"max_tool_calls_per_message": 4}
    params = task_row(0, turns=[{"calls": _echo_calls(100)}, {"say": "done"}])
    async with running_stack(env=Watching, agent_options=options) as stack:
        assert isinstance(stack.agent, ToolAgent)
        response = await stack.agent.take_turn(params["responses_create_params"], None, None)
        sent = dict(stack.env.calls)
    assert sent == {"echo": 4}
    errors = _tool_errors({"response": response})
    assert errors[4:] == [_past(4)] * 96


def test_the_tool_call_caps_are_typed_options_with_sane_defaults() -> None:
    options = ToolAgent.Options()
    assert (options.max_tool_calls_per_message, options.max_tool_calls) == (64, 256)
    for bad in [{"max_tool_calls_per_message": 0}, {"max_tool_calls": 0}]:
        with pytest.raises(ValidationError, match="greater than or equal to 1"):
            ToolAgent.Options.model_validate(bad)


@pytest.mark.parametrize(
    "name",
    [
        "__init__",
        "_session",
        "shutdown",
        "startup",
        "seed_session",
        "verify",
        "VERIFY",
        "\uff56\uff45\uff52\uff49\uff46\uff59",  # fullwidth "verify"
        "verify\u200b",  # a zero-width space after it
        "\uff45\uff43\uff48\uff4f",  # fullwidth "echo": a lookalike of a real tool
        "x" * 65,
    ],
)
async def test_a_name_that_is_no_tool_never_reaches_the_env_even_when_declared(name: str) -> None:
    row = _calling({"text": "v0"}, name)
    row["responses_create_params"]["tools"] = [ECHO_TOOL, {**ECHO_TOOL, "name": name}]
    async with running_stack(env=Watching) as stack:
        status, body = await post_run(stack.agent_url, row)
        sent = dict(stack.env.calls)
    assert status == 200, body
    assert sent == {"seed_session": 1, "verify": 1}  # nothing else, under any path
    assert _tool_errors(body) == [f"unknown tool {name!r}"]
    assert body["reward"] == 1.0
