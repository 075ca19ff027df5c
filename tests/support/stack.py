"""The test stack: scripted model + echo env + tool agent. Task rows and files, configs, fast
retry policies, and ``running_stack``, which serves the three in-process on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.config import Config, RetryPolicy, kind_defaults, parse_config
from rollgym.dialects import SERVER_DIALECTS
from rollgym.http import Target
from rollgym.server.base import BaseServer
from rollgym.testing import serve_server

from .servers import FAIL_MARKER, CountingEcho, FaultyModel

FAST_BACKOFF: dict[str, Any] = {"backoff_initial": 0.01, "backoff_max": 0.02}
"""Tiny backoff: retries take milliseconds."""

FAST_RETRY: dict[str, Any] = {
    **FAST_BACKOFF,
    "budget": {"enabled": False},
    "breaker": {"enabled": False},
}
"""Tiny backoff, and no retry budget or breaker unless a test asks: retries are deterministic."""


def fast_policy(kind: str | None = None, **overrides: Any) -> RetryPolicy:
    """A retry policy with ``FAST_RETRY``: the defaults of ``kind`` (3 attempts for a model...)
    or the generic ones, then ``overrides``."""
    defaults = kind_defaults(kind) if kind else {}  # type: ignore[arg-type]
    return RetryPolicy.model_validate({**defaults, **FAST_RETRY, **overrides})


# -- task rows ---------------------------------------------------------------------------------

SAY = "The answer is {tool_output}"
SOME_RIGHT = [SAY, "I do not know", "Maybe {tool_output}"]
"""Say the answer or not: the scripted model picks one per rollout key, so the rewards of a
task's repeats differ but every run gives the same ones."""


ECHO_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "echo",
    "description": "Return the text unchanged.",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
}
"""The echo env's tool, declared in every task row (as NeMo Gym rows do): the tool agent calls
only the tools a row declares."""


def script(answer: str, say: str | list[str] = SAY) -> list[dict[str, Any]]:
    """Call echo with ``answer``, then ``say`` it back (a rollout that scores 1.0 by default)."""
    return [{"call": "echo", "arguments": {"text": answer}}, {"say": say}]


def task_row(
    index: int,
    *,
    fail: bool = False,
    say: str | list[str] = SAY,
    turns: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Task ``index``: expects ``v{index}``; ``fail`` carries the ``FaultyModel``'s marker."""
    answer = f"v{index}"
    text = f"task {index}" + (f" {FAIL_MARKER}" if fail else "")
    return {
        "responses_create_params": {
            "input": text,
            "tools": [ECHO_TOOL],
            "metadata": {"rollgym_script": turns or script(answer, say)},
        },
        "expected_answer": answer,
    }


def write_tasks(
    path: Path,
    n: int,
    *,
    fail: set[int] | frozenset[int] = frozenset(),
    say: str | list[str] = SAY,
) -> Path:
    """Tasks ``0..n-1`` as a task file; those in ``fail`` make the ``FaultyModel`` fail."""
    path.write_bytes(
        b"".join(orjson.dumps(task_row(i, fail=i in fail, say=say)) + b"\n" for i in range(n))
    )
    return path


# -- configs -----------------------------------------------------------------------------------


def stack_data(
    collect: dict[str, Any] | None = None,
    *,
    model: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    retry: dict[str, Any] | None = None,
    replicas: int | None = None,
    env_replicas: int | None = None,
    **agent_options: Any,
) -> dict[str, Any]:
    """The stack's config as YAML would hold it. ``model`` / ``env``: keys laid over that
    server's entry (another ``impl``, ``options``, a ``url``, ``chaos``...); ``retry``: the
    model's and env's policy (``FAST_RETRY``); ``replicas``: of the agent, and of the model
    unless it has a ``url``."""
    retry = FAST_RETRY if retry is None else retry
    model_entry = {"kind": "model", "impl": "scripted", "retry": retry, **(model or {})}
    env_entry = {"kind": "resources", "impl": "echo", "retry": retry, **(env or {})}
    agent_entry: dict[str, Any] = {
        "kind": "agent",
        "impl": "tool_agent",
        "options": {"model": "model", "resources": "env", **agent_options},
    }
    if replicas is not None:
        agent_entry["replicas"] = replicas
        if "url" not in model_entry:
            model_entry["replicas"] = replicas
    if env_replicas is not None:
        env_entry["replicas"] = env_replicas
    return {
        "servers": {"model": model_entry, "env": env_entry, "agent": agent_entry},
        "collect": {"concurrency": 8, "rollout_timeout": 60, **(collect or {})},
    }


def stack_config(collect: dict[str, Any] | None = None, **options: Any) -> Config:
    """``stack_data`` validated. For an in-process ``running_stack`` the collector only reads
    the names and the agent's policy from it: nothing is launched."""
    return parse_config(stack_data(collect, **options), "test-config")


# -- the stack served in-process ---------------------------------------------------------------


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
    model: type[FaultyModel] = FaultyModel,
    env: type[CountingEcho] = CountingEcho,
    model_options: dict[str, Any] | None = None,
    agent_options: dict[str, Any] | None = None,
    model_retry: dict[str, Any] | None = None,
    env_retry: dict[str, Any] | None = None,
    model_as: str = "model",
    agent_dialects: tuple[Any, ...] = SERVER_DIALECTS,
    env_replica: type[CountingEcho] | None = None,
) -> AsyncIterator[Stack]:
    """Serve ``model``, ``env`` and the tool agent on 127.0.0.1. The agent calls its peers with
    ``fast_policy`` of their kind, with ``model_retry`` / ``env_retry`` laid over it.
    ``model_as="env"`` points the agent's model at the env server (a misconfiguration: every
    model call answers 404). ``agent_dialects``: what the agent speaks beside flat rows (the
    list every entry point hands its servers, by default). ``env_replica``: a second replica of
    the env, of that class (the agent calls either; ``urls["env"]`` names both)."""
    async with AsyncExitStack() as replicas:
        env_urls: list[str] = []
        if env_replica is not None:
            url, _ = await replicas.enter_async_context(serve_server(env_replica, name="env"))
            env_urls.append(url)
        async with _serve_stack(
            model, env, model_options, agent_options, model_retry, env_retry, model_as,
            agent_dialects, env_urls,
        ) as stack:  # fmt: skip
            yield stack


@asynccontextmanager
async def _serve_stack(
    model: type[FaultyModel],
    env: type[CountingEcho],
    model_options: dict[str, Any] | None,
    agent_options: dict[str, Any] | None,
    model_retry: dict[str, Any] | None,
    env_retry: dict[str, Any] | None,
    model_as: str,
    agent_dialects: tuple[Any, ...],
    more_env_urls: list[str],
) -> AsyncIterator[Stack]:
    async with (
        serve_server(model, name="model", options=model_options) as (model_url, model_server),
        serve_server(env, name="env") as (env_url, env_server),
    ):
        model_target_url = env_url if model_as == "env" else model_url
        peers = {
            "model": Target.single(
                "model", model_target_url, fast_policy("model", **(model_retry or {}))
            ),
            "env": Target(
                "env", (env_url, *more_env_urls), fast_policy("resources", **(env_retry or {}))
            ),
        }
        options = {"model": "model", "resources": "env", **(agent_options or {})}
        async with serve_server(
            "tool_agent", name="agent", options=options, peers=peers, dialects=agent_dialects
        ) as (
            agent_url,
            agent,
        ):
            assert isinstance(model_server, FaultyModel)
            assert isinstance(env_server, CountingEcho)
            urls = {"model": [model_url], "env": [env_url, *more_env_urls], "agent": [agent_url]}
            yield Stack(urls, model_server, env_server, agent)


# -- a run stopped at its budget with rollouts held in flight ----------------------------------


async def run_held_to_an_abandon_cap(
    stack: Stack, tmp_path: Path, n: int, concurrency: int, dispatcher: Any = None
) -> Any:
    """Run ``n`` one-turn tasks with ``concurrency`` against ``stack`` (its model started with
    ``hold_each``) under a budget of 1 token with ``in_flight: abandon``: once ``concurrency``
    rollouts are held at the model, one is let on; its record reaches the cap, and the rest are
    cancelled. ``dispatcher``: the collector's (default: local). The run's outcome; its
    directory is ``tmp_path / "out"``."""
    import asyncio

    from rollgym.collect import Collector, prepare_run

    from .waiting import wait_until

    rows = [task_row(i, turns=[{"say": f"The answer is v{i}"}]) for i in range(n)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cfg = stack_config({"concurrency": concurrency,
                        "budget": {"tokens": 1, "in_flight": "abandon"}})  # fmt: skip
    run = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
    collector = Collector(run, stack.urls, progress=False, dispatcher=dispatcher)
    running = asyncio.create_task(collector.execute())
    try:
        await wait_until(lambda: len(stack.model.holding) >= concurrency, timeout=120,
                         what=f"{concurrency} rollouts held at the model")  # fmt: skip
        stack.model.release(1)
        async with asyncio.timeout(120):
            return await running
    finally:
        running.cancel()
        stack.model.release(len(stack.model.holding))  # nothing left waiting
