"""rollgym's collector driving NeMo Gym 0.7 Environment Servers, and materialized task rows.

The environment server here is a fake written for these tests: a Starlette app that is as
strict about the episode request as 0.7's models are (``extra="forbid"`` everywhere, the same
rollout-id pattern, 422 for a body that does not validate) and answers each attempt of an
episode as the task's ``script`` says: ``ok`` (a result with the task's reward), ``retry`` (a
non-terminal failure), ``terminal`` (a terminal one, at stage ``verification``), ``422``, or
``garbage`` (a 200 that is no episode response). A flat row (a 0.7 relay's input) is answered
with a flat verify response, or 0.7's flattened failure when the row asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.collect import RolloutPolicy, RunningServers, RunOutcome, run_collection
from rollgym.collect.dialect import Dialects
from rollgym.collect.rundir import prepare_run
from rollgym.collect.tasks import scan_tasks
from rollgym.config import Config, parse_config
from rollgym.dialects import ROW_DIALECTS
from rollgym.errors import ConfigError, InputError, RollgymError
from rollgym.testing import serve_asgi
from tests.compat.stack import echo_row, serve_stack, write_rows
from tests.support.ledger import assert_ledger_invariant, keys, read_jsonl

pytestmark = pytest.mark.timeout(90)

FAST = {
    "backoff_initial": 0.01,
    "backoff_max": 0.02,
    "budget": {"enabled": False},
    "breaker": {"enabled": False},
}


# -- the fake 0.7 Environment Server -----------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _EpisodeId(_Strict):
    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)


class _TaskId(_Strict):
    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class _Task(_Strict):
    task_id: _TaskId
    task_input: dict[str, Any]


class _EpisodeRequest(_Strict):
    episode_id: _EpisodeId
    task: _Task


@dataclass
class FakeEnvironment:
    """What the fake server saw: every episode (rollout_id, attempt, task_id) in arrival
    order, and every flat row. ``fixed``: task ids whose script is ignored (they succeed)."""

    name: str
    episodes: list[tuple[str, int, str]] = field(default_factory=list)
    flat: list[dict[str, Any]] = field(default_factory=list)
    fixed: set[str] = field(default_factory=set)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/run", self.run, methods=["POST"]),
                Route("/health", self.health, methods=["GET", "POST"]),
            ]
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def run(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        if isinstance(body, dict) and "episode_id" not in body and "task" not in body:
            return self._flat(body)
        try:
            req = _EpisodeRequest.model_validate(body)
        except ValidationError as exc:
            return JSONResponse({"detail": orjson.loads(exc.json())}, status_code=422)
        rid, attempt = req.episode_id.rollout_id, req.episode_id.attempt
        task_id = req.task.task_id
        self.episodes.append((rid, attempt, task_id.task_id))
        data = req.task.task_input.get("task_data", {})
        script = data.get("script", ["ok"])
        step = "ok" if task_id.task_id in self.fixed else script[min(attempt, len(script) - 1)]
        echo = {"episode_id": req.episode_id.model_dump(), "task_id": task_id.model_dump()}
        if step == "422":
            return JSONResponse({"detail": "scripted 422"}, status_code=422)
        if step == "garbage":
            return JSONResponse({"hello": "world"})
        if step == "retry":
            failure = {"failure_reason": "Episode timed out", "terminal": False}
            return JSONResponse({**echo, "result": None, "failure": failure})
        if step == "terminal":
            failure = {
                "failure_reason": "verifier crashed: KeyError('x')",
                "terminal": True,
                "stage": "verification",
                "partial_response": None,
            }
            return JSONResponse({**echo, "result": None, "failure": failure})
        result = {
            "responses_create_params": req.task.task_input["responses_create_params"],
            "response": {"id": f"resp-{rid}", "output": []},
            "reward": float(data.get("reward", 1.0)),
            "mask_sample": False,
            "failure_kind": None,
            "failure_reason": None,
            "served_by": self.name,
            **data.get("result_fields", {}),
        }
        return JSONResponse({**echo, "result": result, "failure": None})

    def _flat(self, row: dict[str, Any]) -> Response:
        """A relay's answer: the agent's verify response, or 0.7's flattened failure."""
        self.flat.append(row)
        if row.get("fail") == "legacy":
            return JSONResponse(
                {
                    "_ng_failure_class": "environment_server_failed",
                    "_ng_failure_terminal": True,
                    "_ng_failure_message": "agent said no",
                    "_ng_failure_stage": "agent",
                }
            )
        return JSONResponse({**row, "response": {"output": []}, "reward": 0.5})


def episode_row(task_id: str, *, taskset: str = "fake:set", **task_data: Any) -> dict[str, Any]:
    """A materialized row of 0.7's ``single_agent_turn`` shape."""
    return {
        "task_id": {"taskset": taskset, "task_id": task_id},
        "task_input": {
            "responses_create_params": {"input": f"question {task_id}"},
            "task_data": task_data,
        },
    }


def env_config(urls: dict[str, str], collect: dict[str, Any] | None = None, **retry: Any) -> Config:
    """Environment servers by URL only (what a 0.7 user runs)."""
    servers = {
        name: {"kind": "environment", "url": url, "retry": {**FAST, **retry}}
        for name, url in urls.items()
    }
    return parse_config(
        {
            "servers": servers,
            "collect": {"concurrency": 4, "rollout_timeout": 30, **(collect or {})},
        },
        "env-config.yaml",
    )


async def collect(
    cfg: Config, rows: Path, out: Path, urls: dict[str, list[str]], *, resume: bool = False
) -> RunOutcome:
    return await run_collection(
        cfg, cfg.collect, rows, out, RunningServers(urls), resume=resume, progress=False,
        dialects=ROW_DIALECTS,
    )  # fmt: skip


def error_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A failure record's error and its origins, flattened (outermost wins)."""
    fields: dict[str, Any] = {}
    error: Any = record["error"]
    while isinstance(error, dict):
        for key, value in error.items():
            fields.setdefault(key, value)
        error = error.get("origin")
    return fields


# -- episodes ----------------------------------------------------------------------------------


async def test_a_run_against_an_environment_server_records_its_rewards(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [episode_row("t0"), episode_row("t1", reward=0.0), episode_row("t2", reward=0.25)],
    )
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url}, {"repeats": 2})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 0
    rollouts, failures = assert_ledger_invariant(tmp_path / "out")
    assert failures == []
    by_key = {(r["task_index"], r["rollout_index"]): r for r in rollouts}
    assert {k: r["reward"] for k, r in by_key.items()} == {
        (0, 0): 1.0, (0, 1): 1.0, (1, 0): 0.0, (1, 1): 0.0, (2, 0): 0.25, (2, 1): 0.25,
    }  # fmt: skip
    for (task, _), rec in by_key.items():
        assert rec["_ng_task_id"] == {"taskset": "fake:set", "task_id": f"t{task}"}
        assert rec["_ng_task_index"] == task
        assert rec["served_by"] == "env07" and rec["attempts"] == 1
    # 0.7's rollout ids, every first try attempt 0.
    assert sorted(fake.episodes) == sorted(
        (f"{t}-{r}", 0, f"t{t}") for t in range(3) for r in range(2)
    )
    metrics = orjson.loads((tmp_path / "out" / "metrics.json").read_bytes())
    assert metrics["counts"]["succeeded"] == 6
    assert metrics["reward"]["mean"] == pytest.approx((1.0 + 0.0 + 0.25) / 3)


async def test_a_rollgym_agents_own_numbers_come_back_to_the_top_of_the_record(
    tmp_path: Path,
) -> None:
    # A rollgym agent answers them under _rollgym_agent (0.7's aggregate skips "_" keys); the
    # record has them where the flat /run puts them, the result's own top-level fields winning.
    own = {"num_steps": 3, "truncated": False, "agent_seconds": 0.5, "stray": 1}
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [episode_row("t0", result_fields={"_rollgym_agent": own, "agent_seconds": 2.0})],
    )
    fake = FakeEnvironment("env07")
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 0
    [record], _ = assert_ledger_invariant(tmp_path / "out")
    assert (record["num_steps"], record["truncated"], record["agent_seconds"]) == (3, False, 2.0)
    assert "_rollgym_agent" not in record and "stray" not in record


async def test_a_non_terminal_failure_is_run_again_as_the_next_attempt(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(tmp_path / "tasks.jsonl", [episode_row("t0", script=["retry", "ok"])])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 0
    assert fake.episodes == [("0-0", 0, "t0"), ("0-0", 1, "t0")]  # same id, attempt + 1
    rollouts, _ = assert_ledger_invariant(tmp_path / "out")
    assert [(r["reward"], r["attempts"]) for r in rollouts] == [(1.0, 2)]


async def test_non_terminal_failures_stop_at_the_servers_max_attempts(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(tmp_path / "tasks.jsonl", [episode_row("t0", script=["retry"])])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url}, max_attempts=2)
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 1
    assert [a for _, a, _ in fake.episodes] == [0, 1]
    _, failures = assert_ledger_invariant(tmp_path / "out")
    assert failures[0]["attempts"] == 2
    assert error_fields(failures[0])["terminal"] is False


async def test_a_terminal_failure_is_recorded_at_once_with_terminal_and_stage(
    tmp_path: Path,
) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(
        tmp_path / "tasks.jsonl", [episode_row("t0"), episode_row("t1", script=["terminal"])]
    )
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 1
    assert [e for e in fake.episodes if e[2] == "t1"] == [("1-0", 0, "t1")]  # never again
    rollouts, failures = assert_ledger_invariant(tmp_path / "out")
    assert keys(rollouts) == [(0, 0)] and keys(failures) == [(1, 0)]
    failure = failures[0]
    assert failure["attempts"] == 1
    assert failure["_ng_task_id"] == {"taskset": "fake:set", "task_id": "t1"}
    fields = error_fields(failure)
    assert fields["terminal"] is True and fields["stage"] == "verification"
    # The compact record leaves out a retryable its class implies; the error read back says it.
    assert fields["server"] == "env07"
    assert RollgymError.from_dict(failure["error"]).retryable is False
    assert "verifier crashed" in fields["message"]


async def test_a_422_is_never_retried(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(tmp_path / "tasks.jsonl", [episode_row("t0", script=["422", "ok"])])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url}, max_attempts=3)
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 1
    assert fake.episodes == [("0-0", 0, "t0")]
    _, failures = assert_ledger_invariant(tmp_path / "out")
    assert failures[0]["attempts"] == 1
    assert failures[0]["error"]["status"] == 422
    assert failures[0]["_ng_task_id"]["task_id"] == "t0"


async def test_an_answer_that_is_no_episode_response_is_a_protocol_error(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(tmp_path / "tasks.jsonl", [episode_row("t0", script=["garbage", "ok"])])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 1
    assert len(fake.episodes) == 1  # a broken protocol is not retried
    _, failures = assert_ledger_invariant(tmp_path / "out")
    error = failures[0]["error"]
    assert error["type"] == "protocol_error" and error["server"] == "env07"
    assert "env07" in error["message"] and "episode response" in error["message"]


async def test_the_environment_servers_request_is_what_0_7_validates(tmp_path: Path) -> None:
    """The fake refuses with 422 any key 0.7's models do not have: every episode went through,
    so the request carries nothing else (no indices, no stamps, no agent_ref)."""
    fake = FakeEnvironment("env07")
    row = {**episode_row("t0"), "_ng_task_index": 7, "_ng_rollout_id": "x", "_ng_attempt_index": 3}
    rows = write_rows(tmp_path / "tasks.jsonl", [row])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url}, {"repeats": 2})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 0
    # The input's _ng_task_index names the rollouts; its per-rollout id and attempt do not.
    assert sorted(fake.episodes) == [("7-0", 0, "t0"), ("7-1", 0, "t0")]
    tasks = read_jsonl(tmp_path / "out" / "tasks.jsonl")
    assert all("_ng_rollout_id" not in t and "_ng_attempt_index" not in t for t in tasks)
    assert tasks[0]["task_id"] == row["task_id"] and tasks[0]["task_input"] == row["task_input"]
    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    assert {r["_ng_task_index"] for r in rollouts} == {7}


# -- routing -----------------------------------------------------------------------------------


async def test_materialized_rows_go_to_the_server_of_their_taskset(tmp_path: Path) -> None:
    a, b = FakeEnvironment("env_a"), FakeEnvironment("env_b")
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [
            episode_row("a0", taskset="a:x"),
            episode_row("b0", taskset="b:y"),
            episode_row("a1", taskset="a:x"),
        ],
    )
    async with serve_asgi(a.app()) as url_a, serve_asgi(b.app()) as url_b:
        cfg = env_config(
            {"env_a": url_a, "env_b": url_b}, {"taskset_routes": {"a:x": "env_a", "b:y": "env_b"}}
        )
        outcome = await collect(cfg, rows, tmp_path / "out", {"env_a": [url_a], "env_b": [url_b]})
    assert outcome.exit_code == 0
    assert sorted(t for _, _, t in a.episodes) == ["a0", "a1"]
    assert [t for _, _, t in b.episodes] == ["b0"]
    rollouts, _ = assert_ledger_invariant(tmp_path / "out")
    assert {r["_ng_task_id"]["task_id"]: r["served_by"] for r in rollouts} == {
        "a0": "env_a", "a1": "env_a", "b0": "env_b",
    }  # fmt: skip


async def test_an_unrouted_taskset_stops_the_run_before_anything_is_sent(tmp_path: Path) -> None:
    a, b = FakeEnvironment("env_a"), FakeEnvironment("env_b")
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [episode_row("a0", taskset="a:x"), episode_row("c0", taskset="c:z")],
    )
    async with serve_asgi(a.app()) as url_a, serve_asgi(b.app()) as url_b:
        cfg = env_config({"env_a": url_a, "env_b": url_b}, {"taskset_routes": {"a:x": "env_a"}})
        with pytest.raises(InputError) as err:
            await collect(cfg, rows, tmp_path / "out", {"env_a": [url_a], "env_b": [url_b]})
    message = err.value.message
    assert "tasks.jsonl:2: no server runs taskset 'c:z'" in message
    assert "collect.taskset_routes" in message
    assert a.episodes == [] and b.episodes == []
    assert not (tmp_path / "out" / "tasks.jsonl").exists()


def test_one_environment_server_needs_no_route(tmp_path: Path) -> None:
    rows = write_rows(
        tmp_path / "tasks.jsonl", [episode_row("a", taskset="a:x"), episode_row("b", taskset="b")]
    )
    cfg = env_config({"env07": "http://127.0.0.1:9"})
    prepared = prepare_run(
        cfg, cfg.collect, rows, tmp_path / "out", resume=False, dialects=Dialects(ROW_DIALECTS)
    )
    assert prepared.info.named("taskset") == {"a:x", "b"}


async def test_a_mixed_file_runs_flat_rows_on_the_agent_and_materialized_ones_by_taskset(
    tmp_path: Path,
) -> None:
    """Flat rows go to rollgym's agent; ``echo:set`` rows too, as the flat row built from their
    task input; ``fake:set`` rows to the environment server, as episodes; a flat row naming
    a 0.7 agent goes, aliased, to the environment server flat (a 0.7 relay's input)."""
    fake = FakeEnvironment("env07")
    echo = echo_row(1)
    as_task = {
        "task_id": {"taskset": "echo:set", "task_id": "e1"},
        "task_input": {
            "responses_create_params": echo["responses_create_params"],
            "expected_answer": echo["expected_answer"],  # flat: merged into task_data
        },
    }
    relayed = {**echo_row(3), "agent_ref": {"name": "mcqa_simple_agent"}}
    rows = write_rows(
        tmp_path / "tasks.jsonl", [echo_row(0), as_task, episode_row("f2", reward=0.0), relayed]
    )
    async with serve_stack() as urls, serve_asgi(fake.app()) as env_url:
        cfg = _mixed_config(urls, env_url)
        outcome = await collect(cfg, rows, tmp_path / "out", {**urls, "env07": [env_url]})
    assert outcome.exit_code == 0, read_jsonl(tmp_path / "out" / "failures.jsonl")
    rollouts, _ = assert_ledger_invariant(tmp_path / "out")
    by_task = {r["task_index"]: r for r in rollouts}
    assert {t: r["reward"] for t, r in by_task.items()} == {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.5}
    assert "_ng_task_id" not in by_task[0] and "_ng_task_id" not in by_task[3]
    assert by_task[1]["_ng_task_id"] == {"taskset": "echo:set", "task_id": "e1"}
    assert by_task[2]["_ng_task_id"] == {"taskset": "fake:set", "task_id": "f2"}
    assert [t for _, _, t in fake.episodes] == ["f2"]
    assert [r["expected_answer"] for r in fake.flat] == ["v3"]
    tasks = read_jsonl(tmp_path / "out" / "tasks.jsonl")
    assert tasks[1]["task_input"] == as_task["task_input"]  # kept as given


def _mixed_config(urls: dict[str, list[str]], env_url: str, **collect: Any) -> Config:
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted", "retry": FAST},
                "env": {"kind": "resources", "impl": "echo", "retry": FAST},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "model", "resources": "env"},
                },
                "env07": {"kind": "environment", "url": env_url, "retry": FAST},
            },
            "collect": {
                "concurrency": 4,
                "rollout_timeout": 30,
                "taskset_routes": {"echo:set": "agent", "fake:set": "env07"},
                "agent_aliases": {"mcqa_simple_agent": "env07"},
                **collect,
            },
        },
        "mixed.yaml",
    )


async def test_0_7s_flattened_failure_from_a_relay_is_a_failure(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(tmp_path / "tasks.jsonl", [{**echo_row(0), "fail": "legacy"}, echo_row(1)])
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        outcome = await collect(cfg, rows, tmp_path / "out", {"env07": [url]})
    assert outcome.exit_code == 1
    rollouts, failures = assert_ledger_invariant(tmp_path / "out")
    assert [r["reward"] for r in rollouts] == [0.5]
    fields = error_fields(failures[0])
    assert fields["terminal"] is True and fields["stage"] == "agent"
    assert fields["message"].endswith("agent said no") and fields["server"] == "env07"


# -- resume ------------------------------------------------------------------------------------


async def test_resume_runs_the_failed_materialized_rollouts_again(tmp_path: Path) -> None:
    fake = FakeEnvironment("env07")
    rows = write_rows(
        tmp_path / "tasks.jsonl", [episode_row("t0"), episode_row("t1", script=["retry"])]
    )
    out = tmp_path / "out"
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url}, {"repeats": 2}, max_attempts=1)
        first = await collect(cfg, rows, out, {"env07": [url]})
        assert first.exit_code == 1
        _, failures = assert_ledger_invariant(out)
        assert sorted(keys(failures)) == [(1, 0), (1, 1)]
        assert all(f["_ng_task_id"]["task_id"] == "t1" for f in failures)
        fake.fixed.add("t1")
        seen = len(fake.episodes)
        again = await collect(cfg, rows, out, {"env07": [url]}, resume=True)
    assert again.exit_code == 0
    # Only the failed rollouts were sent again, as their next attempt.
    assert sorted(fake.episodes[seen:]) == [("1-0", 1, "t1"), ("1-1", 1, "t1")]
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == []
    redone = [r for r in rollouts if r["task_index"] == 1]
    assert [(r["attempts"], r["_ng_task_id"]["task_id"]) for r in redone] == [(2, "t1")] * 2


# -- on Ray -------------------------------------------------------------------------------------


async def test_episodes_run_the_same_on_ray_workers(tmp_path: Path, ray_cluster: Any) -> None:
    """The work items and failure records of materialized rows cross the actor boundary with
    what they carry: the episode form, the task id."""
    from rollgym.ray import RayDispatcher  # only this test may import Ray

    fake = FakeEnvironment("env07")
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [
            episode_row("t0"),
            episode_row("t1", script=["retry", "ok"], reward=0.5),
            episode_row("t2", script=["terminal"]),
        ],
    )
    async with serve_asgi(fake.app()) as url:
        cfg = env_config({"env07": url})
        dispatcher = RayDispatcher(RolloutPolicy.from_collect(cfg.collect), 4, workers=1)
        outcome = await run_collection(
            cfg, cfg.collect, rows, tmp_path / "out", RunningServers({"env07": [url]}),
            dispatcher=dispatcher, progress=False, dialects=ROW_DIALECTS,
        )  # fmt: skip
    assert outcome.exit_code == 1
    rollouts, failures = assert_ledger_invariant(tmp_path / "out")
    assert {r["_ng_task_id"]["task_id"]: (r["reward"], r["attempts"]) for r in rollouts} == {
        "t0": (1.0, 1), "t1": (0.5, 2),
    }  # fmt: skip
    assert [f["_ng_task_id"]["task_id"] for f in failures] == ["t2"]
    assert error_fields(failures[0])["terminal"] is True
    assert sorted(fake.episodes) == [
        ("0-0", 0, "t0"), ("1-0", 0, "t1"), ("1-0", 1, "t1"), ("2-0", 0, "t2"),
    ]  # fmt: skip


# -- validation --------------------------------------------------------------------------------


def test_an_environment_server_is_given_by_url_only() -> None:
    with pytest.raises(ConfigError, match=r"servers\.e: .*give its url:"):
        parse_config({"servers": {"e": {"kind": "environment"}}})
    with pytest.raises(ConfigError, match=r"no impl:"):
        parse_config({"servers": {"e": {"kind": "environment", "impl": "echo", "url": "http://x"}}})
    with pytest.raises(ConfigError, match=r"taskset_routes\.a:x: 'nope' is not an agent server"):
        parse_config(
            {
                "servers": {"e": {"kind": "environment", "url": "http://x"}},
                "collect": {"taskset_routes": {"a:x": "nope"}},
            }
        )


def test_an_environment_servers_episodes_are_retried_by_the_run_not_the_client() -> None:
    cfg = env_config({"e": "http://x"})
    retry = cfg.servers["e"].retry
    assert retry.max_attempts == 3  # episodes
    assert retry.for_endpoint("/run")[1] == 1  # each attempt sent once
    assert (
        env_config({"e": "http://x"}, max_attempts=5).servers["e"].retry.for_endpoint("/run")[1]
        == 1
    )


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"task_id": {"taskset": "s", "task_id": 3}, "task_input": {}}, "task_id.task_id"),
        ({"task_id": {"taskset": "s"}, "task_input": {}}, "task_id.task_id"),
        ({"task_id": {"taskset": "s", "task_id": "a", "x": 1}, "task_input": {}}, "task_id.x"),
        ({"task_id": {"taskset": "s", "task_id": "a"}, "task_input": []}, "must be a JSON object"),
        (
            {**episode_row("a"), "responses_create_params": {"input": "x"}},
            "no top-level responses_create_params",
        ),
    ],
)
def test_a_bad_materialized_row_is_refused_with_its_line(
    tmp_path: Path, row: dict[str, Any], problem: str
) -> None:
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(0), row])
    with pytest.raises(InputError) as err:
        scan_tasks(rows, agents={"env07"}, dialects=Dialects(ROW_DIALECTS))
    assert err.value.message.startswith(f"{rows}:2: ")
    assert problem in err.value.message


def test_a_row_for_an_agent_must_give_the_flat_row_it_takes(tmp_path: Path) -> None:
    conflicting = episode_row("a", expected_answer="B")
    conflicting["task_input"]["expected_answer"] = "C"
    rows = write_rows(tmp_path / "tasks.jsonl", [conflicting])
    with pytest.raises(InputError, match=r"tasks\.jsonl:1: task_input: conflicting task field"):
        scan_tasks(rows, agents={"agent"}, dialects=Dialects(ROW_DIALECTS))
    no_params = {"task_id": {"taskset": "s", "task_id": "a"}, "task_input": {"x": 1}}
    rows = write_rows(tmp_path / "tasks.jsonl", [no_params])
    with pytest.raises(InputError, match=r"tasks\.jsonl:1: task_input: .*responses_create_params"):
        scan_tasks(rows, agents={"agent"}, dialects=Dialects(ROW_DIALECTS))
    # An environment server's task input is its own to validate.
    cfg = env_config({"env07": "http://127.0.0.1:9"})
    prepare_run(
        cfg, cfg.collect, rows, tmp_path / "out", resume=False, dialects=Dialects(ROW_DIALECTS)
    )


def test_with_several_servers_a_row_naming_none_is_refused_with_its_line(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(0)])
    cfg = env_config({"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:9"})
    with pytest.raises(InputError, match=r"tasks\.jsonl:1: the row names no agent"):
        prepare_run(cfg, cfg.collect, rows, tmp_path / "out", resume=False)
