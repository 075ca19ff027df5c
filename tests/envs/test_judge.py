"""The LLM-judge environment against a scripted judge (the scripted model, told its verdict by
``judge_params.metadata.rollgym_script``) and judges that fail."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect.metrics import compute_metrics
from rollgym.config import Config
from rollgym.envs.judge.server import JudgeEnv
from rollgym.errors import ConfigError
from rollgym.http import Target
from rollgym.models.scripted import ScriptedModel
from rollgym.testing import serve_server
from rollgym.wire import COST_FIELD
from tests.support.servers import FaultyModel
from tests.support.stack import fast_policy

from .env_client import EnvClient

pytestmark = pytest.mark.timeout(60)
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
    "expected_answer": "Paris",
}


def script(*says: str) -> dict[str, Any]:
    return {"metadata": {"rollgym_script": json.dumps([{"say": s} for s in says])}}


@asynccontextmanager
async def judged(
    connect: Callable[[str], EnvClient],
    options: dict[str, Any],
    judge: type[Any] = ScriptedModel,
    judge_options: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[EnvClient, Any]]:
    async with serve_server(judge, name="judge_model", options=judge_options) as (jurl, model):
        peers = {"judge_model": Target("judge_model", (jurl,), fast_policy("model"))}
        opts = {"judge": "judge_model", **options}
        async with serve_server(JudgeEnv, name="judge", options=opts, peers=peers) as (url, _):
            yield connect(url), model


async def test_equivalence_verdicts(connect: Callable[[str], EnvClient]) -> None:
    for verdict, reward in (("Same. [[A=B]]", 1.0), ("Different. [[A!=B]]", 0.0)):
        async with judged(connect, {"judge_params": script(verdict)}) as (env, _):
            status, body = await env.verify(ROW, "It is Paris.")
        assert status == 200 and body["reward"] == reward, body
        assert body["judge_evaluations"] == [verdict]


async def test_the_first_label_wins_and_both_orders_must_agree(
    connect: Callable[[str], EnvClient],
) -> None:
    async with judged(connect, {"judge_params": script("[[A!=B]] not [[A=B]]")}) as (env, _):
        assert (await env.verify(ROW, "Paris"))[1]["reward"] == 0.0
    # The scripted judge counts model turns in its input: a fresh request is turn 0 each time.
    options = {"judge_params": script("[[A=B]]"), "both_orders": True}
    async with judged(connect, options) as (env, _):
        status, body = await env.verify(ROW, "Paris")
    assert status == 200 and body["reward"] == 1.0 and body["judge_calls"] == 2


async def test_an_unparseable_verdict_is_its_own_failure(
    connect: Callable[[str], EnvClient],
) -> None:
    async with judged(connect, {"judge_params": script("Hmm, hard to say.")}) as (env, _):
        status, body = await env.verify(ROW, "Paris")
    assert status == 502, body
    origin = body["error"]["origin"]
    assert origin["type"] == "unparseable_verdict" and origin["server"] == "judge_model"
    assert "Hmm, hard to say." in origin["body"]
    # The judge answered (and billed): the failed verify says so beside its error.
    spent = body[COST_FIELD]
    assert spent["judge_calls"] == 1 and spent["judge_model"] and spent["judge_input_tokens"] > 0


async def test_a_failing_judge_fails_the_rollout_under_its_retry_policy(
    connect: Callable[[str], EnvClient],
) -> None:
    down = {"fail_status": 503, "down_for": 3600.0}
    async with judged(connect, {}, FaultyModel, down) as (env, model):
        status, body = await env.verify(ROW, "Paris")
    assert status == 502, body  # never a reward of 0
    origin = body["error"]["origin"]
    assert origin["server"] == "judge_model" and origin["status"] == 503
    assert model.requests == 3 == origin["attempts"]  # the model kind's 3 attempts
    assert COST_FIELD not in body  # a 503 is a refusal: nothing was billed


async def test_a_judge_that_fails_after_it_may_have_billed_is_counted(
    connect: Callable[[str], EnvClient],
) -> None:
    """A 500 may come after the judge did the work: each of the environment's attempts is
    counted as a failed judge call, its tokens not known (the error says no ``usage``), on the
    failed verify's answer; never as free, never estimated."""
    down = {"fail_status": 500, "down_for": 3600.0}
    async with judged(connect, {}, FaultyModel, down) as (env, model):
        status, body = await env.verify(ROW, "Paris")
    assert status == 502, body
    assert model.requests == 3
    assert body[COST_FIELD] == {
        "judge_calls": 3, "judge_failed_calls": 3, "judge_unmetered_calls": 3,
        "judge_input_tokens": 0, "judge_output_tokens": 0,
    }  # fmt: skip


async def test_rubric_scores_are_named_sub_scores(connect: Callable[[str], EnvClient]) -> None:
    row = {
        **ROW,
        "rubric": [
            {"name": "correct", "description": "names the right city", "weight": 3},
            {"name": "concise", "description": "one sentence"},
        ],
    }
    options = {"mode": "rubric", "judge_params": script("[[correct: 10]]\n[[concise: 2]]")}
    async with judged(connect, options) as (env, _):
        status, body = await env.verify(row, "Paris, the capital.")
        assert status == 200, body
        assert body["scores"] == {"correct": 1.0, "concise": 0.2}
        assert body["reward"] == pytest.approx((3 * 1.0 + 0.2) / 4)
        missing = {"mode": "rubric", "judge_params": script("[[correct: 10]]")}
    async with judged(connect, missing) as (env, _):
        status, body = await env.verify(row, "Paris")
    assert status == 502 and body["error"]["origin"]["type"] == "unparseable_verdict"
    assert "concise" in body["error"]["origin"]["message"]


def _judge_config(options: dict[str, Any]) -> Config:
    judge = {"kind": "resources", "impl": "rollgym.envs.judge.server:JudgeEnv", "options": options}
    return Config.model_validate(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted"},
                "env": {"kind": "resources", "impl": "echo"},
                "judge": judge,
            }
        }
    )


def test_the_judge_must_be_a_model_server_and_templates_must_fill() -> None:
    with pytest.raises(ConfigError, match=r"servers\.judge\.options\.judge"):
        JudgeEnv.check_options(_judge_config({"judge": "env"}), "judge")
    with pytest.raises(ConfigError, match="template field"):
        JudgeEnv.check_options(
            _judge_config({"judge": "model", "prompt_template": "{answer}"}), "judge"
        )
    JudgeEnv.check_options(_judge_config({"judge": "model"}), "judge")


def test_sub_scores_are_aggregated_in_the_run_metrics(tmp_path: Path) -> None:
    lines = [
        {"task_index": 0, "rollout_index": 0, "reward": 1.0, "scores": {"a": 1.0, "b": 0.5}},
        {"task_index": 0, "rollout_index": 1, "reward": 0.0, "scores": {"a": 0.0, "b": 1.0}},
        {"task_index": 1, "rollout_index": 0, "reward": 0.5, "scores": {"a": 1.0}},
    ]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    scores = compute_metrics(tmp_path, total=4, repeats=2).to_dict()["scores"]
    assert scores["a"] == {
        "mean": pytest.approx(2 / 3),
        "pass_rate": pytest.approx(2 / 3),
        "count": 3,
    }
    assert scores["b"] == {"mean": 0.75, "pass_rate": 0.5, "count": 2}
