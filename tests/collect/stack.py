"""A model + env + agent stack served in-process on 127.0.0.1, and helpers for run outputs."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.config import Config, RetryPolicy, kind_defaults, parse_config
from rollgym.http import Target
from rollgym.server.base import BaseServer
from rollgym.testing import serve_server

from .fault_servers import FAIL_MARKER, CountingEcho, FaultyModel

FAST_RETRY: dict[str, Any] = {
    "backoff_initial": 0.01,
    "backoff_max": 0.02,
    "budget": {"enabled": False},
}
"""Tiny backoff and no retry budget, so retries are deterministic and take milliseconds."""


def fast_policy(kind: str, **overrides: Any) -> RetryPolicy:
    """The kind's default retry policy (3 attempts for a model...), with tiny backoff."""
    return RetryPolicy.model_validate({**kind_defaults(kind), **FAST_RETRY, **overrides})  # type: ignore[arg-type]


def script(answer: str) -> list[dict[str, Any]]:
    """Call echo with ``answer``, then say it back: a rollout that scores 1.0."""
    return [{"call": "echo", "arguments": {"text": answer}}, {"say": "The answer is {tool_output}"}]


def task_row(
    index: int, *, fail: bool = False, turns: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    answer = f"v{index}"
    text = f"task {index}" + (f" {FAIL_MARKER}" if fail else "")
    return {
        "responses_create_params": {
            "input": text,
            "metadata": {"rollgym_script": turns or script(answer)},
        },
        "expected_answer": answer,
    }


def write_tasks(path: Path, n: int, *, fail: set[int] | frozenset[int] = frozenset()) -> Path:
    with path.open("wb") as fh:
        for i in range(n):
            fh.write(orjson.dumps(task_row(i, fail=i in fail)) + b"\n")
    return path


def stack_config(collect: dict[str, Any] | None = None, **agent_options: Any) -> Config:
    """The config the collector sees for the in-process stack (impls are not launched)."""
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted", "retry": FAST_RETRY},
                "env": {"kind": "resources", "impl": "echo", "retry": FAST_RETRY},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "model", "resources": "env", **agent_options},
                },
            },
            "collect": collect or {},
        },
        "test-config",
    )


@dataclass
class Stack:
    urls: dict[str, list[str]]
    model: FaultyModel
    env: CountingEcho
    agent: BaseServer

    @property
    def agent_url(self) -> str:
        return self.urls["agent"][0]


@asynccontextmanager
async def running_stack(
    *,
    model_options: dict[str, Any] | None = None,
    agent_options: dict[str, Any] | None = None,
    model_as: str = "model",
) -> AsyncIterator[Stack]:
    """Serve FaultyModel, CountingEcho and the tool agent; the agent's peers get fast retry
    policies of their kind. ``model_as="env"`` points the agent's model at the env server (a
    misconfiguration: every model call answers 404)."""
    async with (
        serve_server(FaultyModel, name="model", options=model_options) as (model_url, model),
        serve_server(CountingEcho, name="env") as (env_url, env),
    ):
        model_target_url = env_url if model_as == "env" else model_url
        peers = {
            "model": Target.single("model", model_target_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        options = {"model": "model", "resources": "env", **(agent_options or {})}
        async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
            agent_url,
            agent,
        ):
            assert isinstance(model, FaultyModel) and isinstance(env, CountingEcho)
            urls = {"model": [model_url], "env": [env_url], "agent": [agent_url]}
            yield Stack(urls, model, env, agent)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def keys(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(r["task_index"], r["rollout_index"]) for r in records]


def assert_ledger_invariant(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every (task_index, rollout_index) of tasks.jsonl has exactly one record in rollouts.jsonl
    or failures.jsonl; return (rollouts, failures)."""
    expected = keys(read_jsonl(out / "tasks.jsonl"))
    assert expected, "tasks.jsonl is empty"
    assert len(set(expected)) == len(expected)
    rollouts = read_jsonl(out / "rollouts.jsonl")
    failures = read_jsonl(out / "failures.jsonl")
    seen = Counter(keys(rollouts) + keys(failures))
    dupes = {k: n for k, n in seen.items() if n > 1}
    assert not dupes, f"recorded more than once: {dupes}"
    assert set(seen) == set(expected), (
        f"missing: {sorted(set(expected) - set(seen))[:10]}, "
        f"unknown: {sorted(set(seen) - set(expected))[:10]}"
    )
    return rollouts, failures


def error_chain(error: dict[str, Any]) -> list[dict[str, Any]]:
    """An error record and its origins, outermost first."""
    chain = [error]
    while isinstance(chain[-1].get("origin"), dict):
        chain.append(chain[-1]["origin"])
    return chain
