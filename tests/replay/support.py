"""Recording a run for the replay tests: the config's servers launched as processes, as
``rollgym run`` does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import yaml

from rollgym.collect import RunAgents, RunOutcome, local_launcher, run_collection
from rollgym.collect.layout import RunDir
from rollgym.config import Config, load_config

TOOLS = {
    name: {
        "type": "function", "name": name, "description": name,
        "parameters": {"type": "object", "properties": props, "additionalProperties": False},
    }
    for name, props in {
        "stable": {"key": {"type": "string"}}, "clock": {}, "draw": {}, "members": {},
    }.items()
}  # fmt: skip


def script_row(calls: list[str], answer: str = "42") -> dict[str, Any]:
    """A task whose scripted model calls ``calls`` (one tool per turn), then answers."""
    script: list[dict[str, Any]] = [
        {"call": c, "arguments": {"key": f"k{i}"} if c == "stable" else {}}
        for i, c in enumerate(calls)
    ]
    script.append({"say": f"The answer is {answer}"})
    return {
        "responses_create_params": {
            "input": "Use the tools, then answer.",
            "tools": [TOOLS[c] for c in sorted(set(calls) | {"stable"})],
            "metadata": {"rollgym_script": orjson.dumps(script).decode()},
        },
        "expected_answer": "42",
    }


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def write_config(path: Path, env_impl: str, **collect: Any) -> Config:
    data = {
        "servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "env": {"kind": "resources", "impl": env_impl},
            "agent": {
                "kind": "agent", "impl": "tool_agent",
                "options": {"model": "model", "resources": "env", "max_steps": 8},
            },
        },
        "collect": {"concurrency": 8, **collect},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


async def record(cfg: Config, tasks: Path, out: Path) -> RunOutcome:
    agents = RunAgents.of(cfg, cfg.collect)
    launcher = local_launcher(cfg, agents, log_dir=RunDir(out).logs)
    async with asyncio.timeout(120):
        return await run_collection(
            cfg, cfg.collect, tasks, out, launcher, agents=agents, progress=False
        )
