"""A `rollgym run` of the echo environment through `openai_proxy` to a given upstream: the
inputs (tasks and config) the freeze tests and `bench/freeze.py` write, and how many rollouts a
run directory has recorded so far. Imports nothing of rollgym, so a bench can use it against
other code on PYTHONPATH."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_echo_run(
    workdir: Path,
    upstream: str,
    rollouts: int,
    concurrency: int,
    *,
    model: str = "toy",
    model_options: dict[str, Any] | None = None,
    max_output_tokens: int | None = None,
) -> Path:
    """Tasks ``echo v{i}`` and a config (proxy -> echo env -> tool_agent; every other option
    its default) under ``workdir``; returns the config's path."""
    tasks = workdir / "tasks.jsonl"
    with tasks.open("w") as fh:
        for i in range(rollouts):
            params: dict[str, Any] = {"input": f"echo v{i}"}
            if max_output_tokens is not None:
                params["max_output_tokens"] = max_output_tokens
            fh.write(json.dumps({"responses_create_params": params, "expected_answer": f"v{i}"}))
            fh.write("\n")
    options = {"base_url": upstream + "/v1", "model": model, **(model_options or {})}
    config = {
        "servers": {
            "model": {"kind": "model", "impl": "openai_proxy", "options": options},
            "env": {"kind": "resources", "impl": "echo"},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "model", "resources": "env", "tools_from_server": True},
            },
        },
        "collect": {"input": str(tasks), "concurrency": concurrency},
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def recorded(out: Path) -> int:
    """Lines in the run directory's rollouts.jsonl and failures.jsonl so far."""
    return sum(
        (out / name).read_bytes().count(b"\n")
        for name in ("rollouts.jsonl", "failures.jsonl")
        if (out / name).exists()
    )
