"""Scripted agents for Harbor tasks, as Harbor's own ``oracle`` and ``nop``.

- ``harbor_oracle`` replays the task's ``solution/solve.sh`` through the environment's
  ``run_command`` tool: the script is the command's stdin (``bash -s``), so the solution never
  enters the container as a directory and the oracle uses no door a model does not have.
- ``harbor_nop`` does nothing, then verifies: what a task pays for no work (it must be 0).

The model-driven terminal agent is rollgym's ``tool_agent`` with the rows' tools: the
instruction and the tools' answers are all the model sees.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from rollgym.agents.response import function_call_output
from rollgym.errors import InvalidRequest
from rollgym.harbor.task import HARBOR_ROW, load_tasks
from rollgym.server.agent import AgentServer, RunContext
from rollgym.server.base import ModelPeer, ServerContext

ORACLE_TIMEOUT_MARGIN = 10.0


def scripted_response(items: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """A Responses API response holding ``items`` (a scripted agent's turn)."""
    return {
        "id": f"resp_{os.urandom(8).hex()}", "object": "response", "created_at": int(time.time()),
        "model": model, "status": "completed", "output": items, "parallel_tool_calls": False,
        "tool_choice": "auto", "tools": [],
    }  # fmt: skip


class _Scripted(AgentServer):
    class Options(AgentServer.Options):
        model: ModelPeer | None = None  # type: ignore[assignment]  # a script calls no model

    options: Options

    async def startup(self) -> None:
        self.resources_client()  # no model to find


class NopAgent(_Scripted):
    """Seeds the task's container, does nothing, verifies."""

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        episode = ctx.episode()
        await episode.seed(row)
        return await episode.verify(row, scripted_response([], "nop"))


class OracleAgent(_Scripted):
    """Replays each task's ``solution/solve.sh`` through ``run_command`` (as stdin)."""

    class Options(_Scripted.Options):
        tasks_dir: str = Field(description="the directory of Harbor tasks the rows name")

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        directory = Path(self.options.tasks_dir).absolute()
        self.tasks = {t.name: t for t in load_tasks(directory)}

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        named = row.get(HARBOR_ROW)
        name = named.get("task") if isinstance(named, dict) else None
        task = self.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            raise InvalidRequest(f"row names no task of {self.options.tasks_dir}: {name!r:.80}")
        if not task.solution.is_file():
            raise InvalidRequest(f"{task.solution}: missing (the oracle replays it)")
        solve = task.solution.read_text(encoding="utf-8")
        # As Harbor's oracle runs it: DEBIAN_FRONTEND=noninteractive and [solution] env.
        env = {"DEBIAN_FRONTEND": "noninteractive", **task.config.solution.env}
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        solve = exports + solve
        episode = ctx.episode()
        await episode.seed(row)
        call_id = f"call_{os.urandom(8).hex()}"
        arguments = {
            "command": "bash -s",
            "stdin": solve,
            "timeout": min(task.agent_timeout, self.options.tool_timeout - ORACLE_TIMEOUT_MARGIN),
        }
        args_json = _json(arguments)
        output = await episode.call_tool("run_command", arguments)
        items = [
            {
                "type": "function_call", "id": f"fc_{os.urandom(8).hex()}", "call_id": call_id,
                "name": "run_command", "arguments": args_json, "status": "completed",
            },
            function_call_output(call_id, output),
        ]  # fmt: skip
        verified = await episode.verify(row, scripted_response(items, "oracle"))
        verified.setdefault("oracle_output", output[-2000:])
        return verified


def _json(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()
