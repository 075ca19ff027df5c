"""A run of a directory of Harbor tasks with no config file, as ``harbor run -p DIR`` does:
the config ``rollgym run TASKS_DIR --agent oracle|nop|terminal`` builds, and its input rows.

    servers:
      tasks:    {kind: resources, impl: harbor, options: {tasks_dir: DIR}}
      oracle:   {kind: agent, impl: harbor_oracle, options: {resources: tasks, tasks_dir: DIR}}
      nop:      {kind: agent, impl: harbor_nop, options: {resources: tasks}}
      terminal: {kind: agent, impl: tool_agent, options: {model: model, resources: tasks, ...}}
      model:    {kind: model, impl: openai_proxy, options: {base_url: URL}}   # terminal only

Only the chosen agent (and the model, for ``terminal``) is in the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollgym.errors import ConfigError
from rollgym.harbor.task import load_tasks

AGENTS = ("oracle", "nop", "terminal")
INPUT_NAME = "harbor_tasks.jsonl"
"""The rows of the tasks, written beside the run's files (the run's input)."""
TERMINAL_STEPS = 40
TOOL_TIMEOUT = 900.0
CONCURRENCY = 4
"""Containers at once by default: a task's container holds a core while it works."""


def harbor_config(
    tasks_dir: Path,
    agent: str | None,
    *,
    model_url: str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """The config (as data for ``rollgym.config.parse_config``) that runs ``tasks_dir`` with
    ``agent``."""
    agent = agent or "oracle"
    if agent not in AGENTS:
        raise ConfigError(f"--agent {agent!r}: a directory of Harbor tasks runs with one of "
                          f"{', '.join(AGENTS)}")  # fmt: skip
    tasks = load_tasks(tasks_dir)  # every task read now: a bad one fails before anything runs
    directory = str(Path(tasks_dir).absolute())
    agent_options: dict[str, Any] = {
        "resources": "tasks", "tool_timeout": TOOL_TIMEOUT, "verify_timeout": TOOL_TIMEOUT,
    }  # fmt: skip
    servers: dict[str, Any] = {
        "tasks": {"kind": "resources", "impl": "harbor", "options": {"tasks_dir": directory}},
    }
    if agent == "terminal":
        if not model_url:
            raise ConfigError(
                "--agent terminal needs a model: --model-url URL (an OpenAI-compatible "
                "endpoint, e.g. vLLM's http://host:8000/v1)"
            )
        proxy: dict[str, Any] = {"base_url": model_url}
        if model:
            proxy["model"] = model
        servers["model"] = {"kind": "model", "impl": "openai_proxy", "options": proxy}
        servers["terminal"] = {
            "kind": "agent", "impl": "tool_agent",
            "options": {**agent_options, "model": "model", "tools_from_server": True,
                        "max_steps": TERMINAL_STEPS},
        }  # fmt: skip
    else:
        if model_url:
            raise ConfigError(f"--model-url: --agent {agent} calls no model")
        options = dict(agent_options)
        if agent == "oracle":
            options["tasks_dir"] = directory
        servers[agent] = {"kind": "agent", "impl": f"harbor_{agent}", "options": options}
    longest = max(
        t.agent_timeout + t.config.verifier.timeout_sec + t.config.environment.build_timeout_sec
        for t in tasks
    )
    return {
        "servers": servers,
        "collect": {
            "agent": agent, "concurrency": CONCURRENCY, "rollout_timeout": longest + 120.0,
        },
    }  # fmt: skip


def write_rows(tasks_dir: Path, path: Path) -> Path:
    """One row per task of ``tasks_dir``, written to ``path`` (JSONL)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [orjson.dumps(t.row()) for t in load_tasks(tasks_dir)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
