"""``/aggregate_metrics`` in NeMo Gym 0.4.0's shapes, on agents and resources servers.

NeMo Gym's collector posts ``{"verify_responses": [...]}`` to every agent after a run (stripped
of ``response`` but for ``response.usage``, and of ``responses_create_params``) and validates
the answer as ``AggregateMetrics``: ``group_level_metrics``, ``agent_metrics``, ``key_metrics``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollgym.envs.echo.server import EchoEnv
from rollgym.testing import serve_server
from tests.compat.nemo import NEMO_AGGREGATE_KEYS, Recorded, nemo_resources_app
from tests.compat.stack import collect, echo_row, serve_stack, stack_config, write_rows
from tests.support.ledger import read_jsonl

pytestmark = pytest.mark.timeout(60)


class ScoredEcho(EchoEnv):
    """Echo with metrics of its own over the run."""

    row_fields = frozenset({"expected_answer"})

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        rewards = [r["reward"] for r in rollouts]
        return {"hit_rate": sum(rewards) / len(rewards)} if rewards else {}


def _vr(task: int, rollout: int, reward: float, usage: dict[str, int] | None = None) -> Any:
    """One verify response as NeMo Gym's collector strips it before /aggregate_metrics."""
    vr: dict[str, Any] = {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": "mcqa_simple_agent"},
        "expected_answer": "A",
        "reward": reward,
        "extracted": reward == 1.0,
    }
    if usage:
        vr["response"] = {"usage": usage}
    return vr


VERIFY_RESPONSES = [
    _vr(0, 0, 1.0, {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}),
    _vr(0, 1, 0.0, {"input_tokens": 20, "output_tokens": 4, "total_tokens": 24}),
    _vr(1, 0, 1.0),
]


async def post(url: str, body: Any) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
        http.post(url, data=orjson.dumps(body)) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


async def test_an_agent_answers_nemo_gyms_request_with_its_environments_metrics() -> None:
    async with serve_stack(ScoredEcho) as urls:
        status, got = await post(
            f"{urls['agent'][0]}/aggregate_metrics", {"verify_responses": VERIFY_RESPONSES}
        )
    assert status == 200
    assert set(got) == NEMO_AGGREGATE_KEYS
    agent = got["agent_metrics"]
    assert agent["mean/reward"] == pytest.approx(2 / 3)
    assert agent["std/reward"] == pytest.approx(statistics.stdev([1.0, 0.0, 1.0]))
    assert (agent["max/reward"], agent["min/reward"], agent["median/reward"]) == (1.0, 0.0, 1.0)
    assert agent["mean/extracted"] == pytest.approx(2 / 3)  # booleans count as 0/1
    assert agent["mean/input_tokens"] == 15  # usage counts, where a rollout has them
    assert not any("_ng_" in key for key in agent)  # indices are no metrics
    assert agent["hit_rate"] == pytest.approx(2 / 3)  # the environment's own
    assert got["key_metrics"] == {"hit_rate": pytest.approx(2 / 3)}
    first, second = got["group_level_metrics"]
    assert (first["_ng_task_index"], first["num_rollouts"], first["mean/reward"]) == (0, 2, 0.5)
    assert first["std/reward"] == pytest.approx(statistics.stdev([1.0, 0.0]))
    assert [i["rollout_id"] for i in first["rollout_infos"]] == ["0:0", "0:1"]
    # One rollout: pandas' std is NaN, which NeMo Gym's profiler turns into 0.
    assert (second["_ng_task_index"], second["num_rollouts"], second["std/reward"]) == (1, 1, 0.0)


async def test_without_metrics_of_its_own_the_key_metrics_are_the_means() -> None:
    async with serve_server(EchoEnv, name="env") as (url, _):
        status, got = await post(f"{url}/aggregate_metrics", {"verify_responses": VERIFY_RESPONSES})
        empty_status, empty = await post(f"{url}/aggregate_metrics", {"verify_responses": []})
    assert status == 200
    assert got["key_metrics"] == {
        k: v for k, v in got["agent_metrics"].items() if k.startswith("mean/")
    }
    assert "mean/reward" in got["key_metrics"]
    assert (empty_status, empty) == (
        200,
        {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}},
    )


async def test_a_body_of_neither_shape_is_refused_as_a_bad_request() -> None:
    async with serve_server(EchoEnv, name="env") as (url, _):
        status, got = await post(f"{url}/aggregate_metrics", {"verify_responses": "all"})
    assert status == 422
    assert got["error"]["type"] == "invalid_request"
    assert "verify_responses" in got["error"]["message"]


async def test_an_agent_forwards_the_request_to_a_nemo_gym_resources_server() -> None:
    seen = Recorded()
    body = {"verify_responses": VERIFY_RESPONSES}
    async with serve_stack(nemo_resources_app(seen)) as urls:
        status, got = await post(f"{urls['agent'][0]}/aggregate_metrics", body)
    assert status == 200
    assert seen.bodies("/aggregate_metrics") == [body]
    assert got["key_metrics"] == {"mean/reward": pytest.approx(2 / 3)}


async def test_a_run_asks_the_environment_and_writes_nemo_gyms_file(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(0), echo_row(1)])
    out = tmp_path / "out"
    async with serve_stack(ScoredEcho) as urls:
        outcome = await collect(stack_config({"repeats": 2}), rows, out, urls)
    assert outcome.exit_code == 0
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["env_aggregate"]["key_metrics"] == {"hit_rate": 1.0}
    assert metrics["env_aggregate"]["agent_metrics"]["mean/reward"] == 1.0
    (entry,) = orjson.loads((out / "rollouts_aggregate_metrics.json").read_bytes())
    assert entry["agent_ref"] == {"name": "agent"}
    assert [g["_ng_task_index"] for g in entry["group_level_metrics"]] == [0, 1]
    assert [g["num_rollouts"] for g in entry["group_level_metrics"]] == [2, 2]
    for rec in read_jsonl(out / "rollouts.jsonl"):
        assert rec["_ng_task_index"] == rec["task_index"]
        assert rec["_ng_rollout_index"] == rec["rollout_index"]
