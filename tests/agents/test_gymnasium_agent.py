"""The Gymnasium-style agent against real servers on 127.0.0.1: the scripted model plays NeMo
Gym style ``/reset`` + ``/step`` environments (tests/agents/gym_servers.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai.types.responses import Response, ResponseInputItemParam
from pydantic import TypeAdapter

from rollgym.config import load_config
from rollgym.envs.guess.server import GuessEnv
from rollgym.http import Target
from rollgym.server.base import check_servers
from rollgym.testing import serve_asgi, serve_server
from tests.agents.gym_servers import FollowUpEnv, GymEnv, NemoGuessEnv
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(30)

AGENT = "rollgym.agents.gymnasium:GymnasiumAgent"
TIMEOUT = aiohttp.ClientTimeout(total=15)
INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


@dataclass
class GymStack:
    agent_url: str
    env: GymEnv


@asynccontextmanager
async def gym_stack(env: GymEnv, max_steps: int = 10) -> AsyncIterator[GymStack]:
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_asgi(env.app) as env_url,
    ):
        peers = {
            "model": Target.single("model", model_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        options = {"model": "model", "resources": "env", "max_steps": max_steps}
        async with serve_server(AGENT, name="agent", options=options, peers=peers) as (url, _):
            yield GymStack(url, env)


def guess_row(secret: int, says: list[Any], **fields: Any) -> dict[str, Any]:
    script = [s if isinstance(s, dict) else {"say": s} for s in says]
    return {
        "responses_create_params": {
            "input": "Let's play.",
            "metadata": {"rollgym_script": orjson.dumps(script).decode()},
        },
        "secret": secret,
        **fields,
    }


async def post_run(url: str, row: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(url + "/run", data=orjson.dumps(row)) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


def check_shapes(output: list[dict[str, Any]]) -> None:
    """The items other than user messages parse as a Responses API ``Response``; the
    environment's items (observations as user messages, tool outputs) as input items."""
    model_items = [i for i in output if i.get("role") != "user"]
    env_items = [i for i in output if i.get("role") == "user" or i["type"].endswith("_output")]
    base = {"id": "r", "object": "response", "created_at": 0, "model": "m"}
    Response.model_validate(
        {
            **base,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": model_items,
        }
    )
    for item in env_items:
        INPUT_ITEM.validate_python(item)


async def test_an_episode_runs_to_termination_with_per_step_and_final_rewards() -> None:
    says = ["<guess>50</guess>", "<guess>25</guess>", "<guess>42</guess>"]
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        status, body = await post_run(stack.agent_url, guess_row(42, says, task_index=3))
    assert status == 200, body
    assert body["step_rewards"] == [-0.1, -0.1, 1.0]
    assert body["reward"] == pytest.approx(0.8)
    assert body["reward"] == 0.0 + -0.1 + -0.1 + 1.0  # summed in order, as NeMo Gym does
    assert (body["num_steps"], body["terminated"], body["truncated"]) == (3, True, False)
    assert body["info"] == {"result": "win", "steps": 3}  # the last step's info
    assert body["secret"] == 42 and body["task_index"] == 3  # the row's own fields travel
    # The prompt the model saw first: the string prompt as a message, then the reset observation.
    prompt = body["responses_create_params"]["input"]
    assert [m["content"] for m in prompt] == [
        "Let's play.",
        "Guess my number from 1 to 100. Answer <guess>N</guess>.",
    ]
    output = body["response"]["output"]
    roles = [(i["type"], i.get("role")) for i in output]
    assert roles == [("message", "assistant"), ("message", "user")] * 2 + [("message", "assistant")]
    assert [output[1]["content"], output[3]["content"]] == [
        "lower. Guess again.",
        "higher. Guess again.",
    ]
    check_shapes(output)
    usage = body["response"]["usage"]
    assert usage["output_tokens"] == 3  # one whitespace "token" per turn, summed over turns
    assert stack.env.calls == {"reset": 1, "step": 3}
    # Every /step got the row plus that step's model response, nothing more.
    sent = stack.env.step_bodies
    assert [set(b) for b in sent] == [
        {"responses_create_params", "secret", "task_index", "response"}
    ] * 3
    assert "<guess>25</guess>" in orjson.dumps(sent[1]["response"]).decode()


async def test_max_steps_truncates_an_episode_that_has_not_ended() -> None:
    async with gym_stack(NemoGuessEnv("guess"), max_steps=2) as stack:
        status, body = await post_run(stack.agent_url, guess_row(42, ["<guess>1</guess>"]))
    assert status == 200, body
    assert body["step_rewards"] == [-0.1, -0.1]
    assert body["reward"] == -0.1 + -0.1
    assert (body["num_steps"], body["terminated"], body["truncated"]) == (2, False, True)
    # Two model turns; the last observation is recorded (as NeMo Gym does) but never answered.
    kinds = [i.get("role") for i in body["response"]["output"]]
    assert kinds == ["assistant", "user", "assistant", "user"]
    assert stack.env.calls == {"reset": 1, "step": 2}


async def test_an_environment_truncation_ends_the_episode() -> None:
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        status, body = await post_run(
            stack.agent_url, guess_row(42, ["<guess>60</guess>", "I give up"])
        )
    assert status == 200, body
    assert body["step_rewards"] == [-0.1, 0.0]
    assert (body["num_steps"], body["terminated"], body["truncated"]) == (2, False, True)
    assert body["info"] == {"result": "gave_up"}


async def test_tool_outputs_go_back_to_the_model_as_function_call_outputs() -> None:
    says = [{"call": "hint", "arguments": {}}, "It is {tool_output}: <guess>42</guess>"]
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        status, body = await post_run(stack.agent_url, guess_row(42, says))
    assert status == 200, body
    output = body["response"]["output"]
    assert [i["type"] for i in output] == ["function_call", "function_call_output", "message"]
    assert output[1]["call_id"] == output[0]["call_id"]
    assert orjson.loads(output[1]["output"]) == "it is even"
    assert "it is even" in output[2]["content"][0]["text"]  # the model saw the tool output
    assert body["step_rewards"] == [0.0, 1.0] and body["reward"] == 1.0
    check_shapes(output)


async def test_an_environment_500_fails_the_rollout_typed_never_as_reward_0() -> None:
    says = ["<guess>10</guess>", "<guess>42</guess>"]
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        status, body = await post_run(stack.agent_url, guess_row(42, says, fail_at_step=2))
    assert status == 502, body
    assert "reward" not in body
    error = body["error"]
    assert error["type"] == "upstream_error" and error["server"] == "agent"
    origin = error["origin"]
    assert (origin["server"], origin["endpoint"], origin["status"]) == ("env", "/step", 500)
    # /step changes the environment: a 500 is not replayed (resources are not idempotent).
    assert origin["attempts"] == 1 and stack.env.calls["step"] == 2
    assert "environment exploded" in origin["body"]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"observation": None, "terminated": True, "truncated": False}, "no reward"),
        ({"reward": True, "terminated": True, "truncated": False}, "a bool reward"),
        ({"reward": 1.0, "terminated": "yes", "truncated": False}, "terminated 'yes'"),
        ({"reward": 0.0, "done": True}, "an old-style done"),
        (
            {"reward": 0, "terminated": False, "truncated": False, "info": {"tool_outputs": [1]}},
            "bad tool outputs",
        ),
    ],
)
async def test_a_step_answer_outside_the_protocol_is_a_protocol_error(
    bad: dict[str, Any], says: str
) -> None:
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        status, body = await post_run(stack.agent_url, guess_row(42, [says], bad_step=bad))
    assert status == 502, body
    origin = body["error"]["origin"]
    assert (origin["type"], origin["server"], origin["endpoint"]) == (
        "protocol_error",
        "env",
        "/step",
    )


async def test_unknown_keys_in_an_answer_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    bad = {"reward": 1.0, "terminated": True, "truncated": False, "score": 7}
    with caplog.at_level(logging.WARNING, logger="rollgym.agents.gymnasium"):
        async with gym_stack(NemoGuessEnv("warned")) as stack:
            status, body = await post_run(stack.agent_url, guess_row(42, ["x"], bad_step=bad))
    assert status == 200 and body["reward"] == 1.0
    assert any("'score'" in r.getMessage() for r in caplog.records)


async def test_two_concurrent_episodes_keep_their_own_sessions() -> None:
    rows = [
        guess_row(7, ["<guess>9</guess>", "<guess>8</guess>", "<guess>7</guess>"]),
        guess_row(90, ["<guess>50</guess>", "<guess>90</guess>"]),
    ]
    async with gym_stack(NemoGuessEnv("guess")) as stack:
        results = await asyncio.gather(*(post_run(stack.agent_url, r) for r in rows))
    (s1, first), (s2, second) = results
    assert s1 == s2 == 200, results
    assert first["step_rewards"] == [-0.1, -0.1, 1.0] and first["info"]["steps"] == 3
    assert second["step_rewards"] == [-0.1, 1.0] and second["info"]["steps"] == 2
    seen = stack.env.sessions_seen
    assert len(seen) == 2 + 5 and len(set(seen)) == 2  # two sessions, each used by one rollout
    assert stack.env.state == {}  # both episodes ended and were closed


async def test_nemo_gym_multi_turn_example_gives_nemo_gyms_reward_and_transcript() -> None:
    # A row of NeMo Gym's example_multi_turn_gymnasium data and the answers of its recorded
    # rollout: NeMo Gym recorded reward 1.0 and output [assistant, user follow-up, assistant].
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is the chemical symbol for water?"}],
            "metadata": {
                "rollgym_script": orjson.dumps(
                    [
                        {"say": "The chemical symbol for water is **H₂O**."},
                        {"say": "One molecule of water (H₂O) contains **2 hydrogen atoms**."},
                    ]
                ).decode()
            },
        },
        "follow_ups": ["How many hydrogen atoms does one molecule contain?"],
        "expected_answer": "2",
        "agent_ref": {"type": "responses_api_agents", "name": "example_multi_turn_gymnasium_agent"},
    }
    async with gym_stack(FollowUpEnv("example_multi_turn_gymnasium"), max_steps=5) as stack:
        status, body = await post_run(stack.agent_url, row)
    assert status == 200, body
    assert (body["reward"], body["terminated"], body["truncated"]) == (1.0, True, False)
    assert body["info"] == {}
    output = body["response"]["output"]
    assert [(i["type"], i["role"]) for i in output] == [
        ("message", "assistant"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert output[1] == {
        "type": "message",
        "role": "user",
        "content": "How many hydrogen atoms does one molecule contain?",
    }
    # No reset observation: the prompt is the row's own.
    assert body["responses_create_params"]["input"] == row["responses_create_params"]["input"]


# -- the bundled guess environment (rollgym-native, same protocol) --------------------------

GUESS_DIR = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs" / "guess"


def test_the_guess_config_names_the_agent_and_the_env() -> None:
    config = load_config(GUESS_DIR / "config.yaml")
    check_servers(config)  # impls resolve, options (peers, max_steps) are valid
    assert config.servers["agent"].options["max_steps"] == 6


async def test_the_guess_examples_score_as_the_game_says() -> None:
    rows = [
        orjson.loads(line)
        for line in (GUESS_DIR / "data" / "example.jsonl").read_bytes().splitlines()
    ]
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server(GuessEnv, name="guess") as (env_url, env),
    ):
        peers = {
            "model": Target.single("model", model_url, fast_policy("model")),
            "guess": Target.single("guess", env_url, fast_policy("resources")),
        }
        options = {"model": "model", "resources": "guess", "max_steps": 6}
        async with serve_server(AGENT, name="agent", options=options, peers=peers) as (url, _):
            rows = [{**row, "task_index": i, "rollout_index": 0} for i, row in enumerate(rows)]
            results = await asyncio.gather(*(post_run(url, row) for row in rows))
    for row, (status, body) in zip(rows, results, strict=True):
        assert status == 200, body
        said = [
            item["content"][0]["text"]
            for item in body["response"]["output"]
            if item.get("role") == "assistant"
        ]
        # The game from its rules, from what the model said: -0.1 a miss, 1.0 the secret.
        right = [f"<guess>{row['secret']}</guess>" in text for text in said]
        assert right[:-1] == [False] * (len(said) - 1)
        assert body["step_rewards"] == [1.0 if r else -0.1 for r in right]
        assert body["terminated"] is right[-1]
        assert body["truncated"] is (not right[-1] and len(said) == 6)
    by_index = {body["task_index"]: body for _, body in results}
    assert by_index[2]["step_rewards"] == [1.0]  # right first time
    assert by_index[3]["reward"] == pytest.approx(0.5) and by_index[3]["num_steps"] == 6
    assert by_index[4]["step_rewards"] == [-0.1, 1.0]  # no <guess> tag: a miss, asked again
    assert by_index[5]["reward"] == pytest.approx(-0.6) and by_index[5]["truncated"] is True
    assert isinstance(env, GuessEnv) and env.open_episodes == 1  # only the truncated one is open


async def test_the_guess_env_refuses_a_step_without_an_episode() -> None:
    async with (
        serve_server(GuessEnv, name="guess") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        async with http.post(url + "/step", json={"response": {"output": []}}) as resp:
            status, body = resp.status, await resp.json()
        async with http.post(url + "/reset", json={"secret": 0}) as resp:
            bad_status = resp.status
    assert status == 404 and "no episode" in body["error"]["message"]
    assert bad_status == 422
