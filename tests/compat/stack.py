"""The scripted model, an environment and the tool agent on 127.0.0.1, and runs against them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect import RunningServers, RunOutcome, run_collection
from rollgym.config import Config, RetryPolicy, kind_defaults, parse_config
from rollgym.dialects import ROW_DIALECTS
from rollgym.http import Target
from rollgym.server.base import BaseServer
from rollgym.testing import serve_asgi, serve_server
from tests.support.stack import ECHO_TOOL, script

FAST = {"backoff_initial": 0.01, "backoff_max": 0.02, "budget": {"enabled": False}}


def echo_row(index: int, *, tools: bool = True, **fields: Any) -> dict[str, Any]:
    """A row the echo environment scores 1.0: call ``echo``, say what it returned."""
    turns = script(f"v{index}")
    params: dict[str, Any] = {"input": f"task {index}", "metadata": {"rollgym_script": turns}}
    if tools:
        params["tools"] = [ECHO_TOOL]
    return {"responses_create_params": params, "expected_answer": f"v{index}", **fields}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def policy(kind: str) -> RetryPolicy:
    return RetryPolicy.model_validate({**kind_defaults(kind), **FAST})  # type: ignore[arg-type]


def stack_config(collect: dict[str, Any] | None = None, **agent_options: Any) -> Config:
    """The config the collector reads; the servers themselves are served by ``serve_stack``."""
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted", "retry": FAST},
                "env": {"kind": "resources", "impl": "echo", "retry": FAST},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "model", "resources": "env", **agent_options},
                },
            },
            "collect": {"concurrency": 4, "rollout_timeout": 30, **(collect or {})},
        },
        "compat-config.yaml",
    )


@asynccontextmanager
async def serve_stack(
    env: type[BaseServer] | str | Any = "echo", **agent_options: Any
) -> AsyncIterator[dict[str, list[str]]]:
    """Serve the scripted model, ``env`` (a rollgym server class or name, or any ASGI app)
    and the tool agent; yield name -> URLs."""
    async with serve_server("scripted", name="model") as (model_url, _):
        env_cm = serve_server(env, name="env") if isinstance(env, (str, type)) else _asgi(env)
        async with env_cm as (env_url, _):
            peers = {
                "model": Target.single("model", model_url, policy("model")),
                "env": Target.single("env", env_url, policy("resources")),
            }
            options = {"model": "model", "resources": "env", **agent_options}
            async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
                agent_url,
                _,
            ):
                yield {"model": [model_url], "env": [env_url], "agent": [agent_url]}


@asynccontextmanager
async def _asgi(app: Any) -> AsyncIterator[tuple[str, None]]:
    async with serve_asgi(app) as url:
        yield url, None


async def collect(
    cfg: Config, rows: Path, out: Path, urls: dict[str, list[str]], *, agent: str | None = None
) -> RunOutcome:
    return await run_collection(
        cfg, cfg.collect, rows, out, RunningServers(urls), agent=agent, progress=False,
        dialects=ROW_DIALECTS,
    )  # fmt: skip
