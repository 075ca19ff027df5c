"""A NeMo Gym user's first runs, where rollgym used to be silent or unhelpful:

- a native 0.7 Environment Server (``single_agent_turn``) given as ``kind: agent`` answers every
  flat row 422 (``episode_id`` missing): the run stops at once with a ``ConfigError`` that says
  to declare it ``kind: environment`` and give it materialized rows;
- rows whose model calls a tool the row does not declare (0.7's ``example_mcp_weather``) score 0
  under rollgym's agent where NeMo Gym's pays: the run warns, naming the tool and the way out.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.collect import RunningServers, run_collection
from rollgym.config import parse_config
from rollgym.dialects import ROW_DIALECTS
from rollgym.testing import serve_asgi
from tests.compat.stack import collect, echo_row, serve_stack, stack_config, write_rows
from tests.support.ledger import read_jsonl

pytestmark = pytest.mark.timeout(60)


def native_environment_app(seen: list[Any]) -> Starlette:
    """``POST /run`` as 0.7's ``BaseEnvironmentServer`` serves it (FastAPI, the request model
    ``SingleAgentTurnRequest``): a body without ``episode_id`` is FastAPI's 422, here the very
    body the real 0.7.0 answered a flat row with (its errors in FastAPI's order)."""

    async def run(request: Request) -> Response:
        body = orjson.loads(await request.body())
        seen.append(body)
        if "episode_id" in body:
            return JSONResponse({"detail": "not under test"}, status_code=500)
        missing = [
            {"type": "missing", "loc": ["body", key], "msg": "Field required", "input": body}
            for key in ("episode_id", "task")
        ]
        extra = [
            {
                "type": "extra_forbidden",
                "loc": ["body", key],
                "msg": "Extra inputs are not permitted",
                "input": value,
            }
            for key, value in body.items()
        ]
        return JSONResponse({"detail": missing + extra}, status_code=422)

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


@pytest.mark.parametrize("kind", ["agent", "environment"])
async def test_a_native_environment_server_given_flat_rows_stops_the_run_saying_how(
    tmp_path: Path, kind: str
) -> None:
    # A long row: FastAPI echoes it in every error, so the body the error keeps is cut short.
    rows = [echo_row(i, padding="x" * 6000) for i in range(12)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    cfg = parse_config(
        {
            "servers": {"mcqa_single_agent_turn": {"kind": kind, "url": "http://127.0.0.1:9"}},
            "collect": {"concurrency": 1, "rollout_timeout": 30},
        },
        "first-hour.yaml",
    )
    seen: list[Any] = []
    out = tmp_path / "out"
    async with serve_asgi(native_environment_app(seen)) as url:
        outcome = await run_collection(
            cfg, cfg.collect, tasks, out, RunningServers({"mcqa_single_agent_turn": [url]}),
            progress=False, dialects=ROW_DIALECTS,
        )  # fmt: skip
    assert outcome.exit_code != 0 and outcome.status == "aborted"
    reason = outcome.abort_reason or ""
    assert "servers.mcqa_single_agent_turn.kind: environment" in reason
    assert "materialized" in reason and "task_input" in reason
    assert len(seen) < len(rows)  # stopped at the first row, not ground through all of them
    (failed, *_) = read_jsonl(out / "failures.jsonl")
    error = failed["error"]
    assert error["type"] == "config_error" and error["status"] == 422
    assert error["origin"]["type"] == "http_status"  # the server's own answer, kept


async def test_another_422_is_not_taken_for_an_environment_server(tmp_path: Path) -> None:
    async def run(request: Request) -> Response:
        detail = [{"type": "missing", "loc": ["body", "question"], "msg": "Field required"}]
        return JSONResponse({"detail": detail}, status_code=422)

    tasks = write_rows(tmp_path / "tasks.jsonl", [echo_row(0)])
    cfg = parse_config(
        {"servers": {"agent": {"kind": "agent", "url": "http://127.0.0.1:9"}}}, "c.yaml"
    )
    async with serve_asgi(Starlette(routes=[Route("/run", run, methods=["POST"])])) as url:
        await run_collection(
            cfg, cfg.collect, tasks, tmp_path / "out", RunningServers({"agent": [url]}),
            progress=False, dialects=ROW_DIALECTS,
        )  # fmt: skip
    (failed,) = read_jsonl(tmp_path / "out" / "failures.jsonl")
    assert failed["error"]["type"] == "http_status"


async def test_a_tool_the_rows_do_not_declare_is_warned_about_not_paid_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The script calls ``echo``, which these rows do not declare: refused, each pays 0.
    tasks = write_rows(tmp_path / "tasks.jsonl", [echo_row(i, tools=False) for i in range(3)])
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with serve_stack() as urls:
            outcome = await collect(stack_config({"concurrency": 1}), tasks, out, urls)
    assert outcome.exit_code == 0
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert [r["reward"] for r in rollouts] == [0.0] * 3
    assert all(r["rollgym_undeclared_tools"] == ["echo"] for r in rollouts)
    warned = [r.getMessage() for r in caplog.records if "does not declare" in r.getMessage()]
    assert len(warned) == 1  # at the first such rollout, not once per rollout
    assert "echo" in warned[0]
    assert "servers.agent.options.tools_from_server: true" in warned[0]
    (summary,) = orjson.loads((out / "run.json").read_bytes())["warnings"]
    assert summary.startswith("3 rollout(s) (tasks 0, 1, 2) called tools the row does not")


async def test_declared_tools_raise_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [echo_row(0)])
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with serve_stack() as urls:
            outcome = await collect(stack_config(), tasks, out, urls)
    assert outcome.exit_code == 0
    (rollout,) = read_jsonl(out / "rollouts.jsonl")
    assert rollout["reward"] == 1.0 and "rollgym_undeclared_tools" not in rollout
    assert not [r for r in caplog.records if "does not declare" in r.getMessage()]
