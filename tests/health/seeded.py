"""Run directories written by hand, each with one seeded problem, for the health tests.

A record here has the shape of a real one (``tests/health/test_real_runs.py`` checks the
real ones): the rollout's output items, ``usage``, ``rollgym_timing``, ``attempts``,
``finished_at``; a failure carries its error record as the collector writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

T0 = 1_800_000_000.0


def tool_turn(name: str = "lookup") -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "name": name, "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "{}"},
    ]


def answer(text: str = "The answer is 4") -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def rollout(
    task: int,
    rollout_index: int,
    *,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    at: float = T0,
    **fields: Any,
) -> dict[str, Any]:
    """A ``rollouts.jsonl`` record: one tool call, then an answer; rewarded 1 on even
    repeats and 0 on odd ones, so a task's repeats differ (a group with a learning signal)."""
    return {
        "task_index": task,
        "rollout_index": rollout_index,
        "reward": 1.0 if rollout_index % 2 == 0 else 0.0,
        "response": {
            "status": "completed",
            "output": [*tool_turn(), answer()] if output is None else output,
            "usage": usage or {"input_tokens": 40, "output_tokens": 9},
        },
        "rollgym_timing": {"model": [0.01, 0.01], "retries": {}, "total_s": 0.05},
        "attempts": 1,
        "finished_at": at,
        **fields,
    }


def failure(task: int, rollout_index: int, *, server: str = "model", at: float = T0,
            attempts: int = 1) -> dict[str, Any]:  # fmt: skip
    """A ``failures.jsonl`` record: the model answered 500, seen through the agent."""
    return {
        "task_index": task,
        "rollout_index": rollout_index,
        "attempts": attempts,
        "finished_at": at,
        "error": {
            "type": "HTTPStatusError",
            "status": 502,
            "message": "model failed",
            "server": "agent",
            "origin": {"type": "HTTPStatusError", "status": 500, "message": "nan logprob",
                       "server": server},
        },
        "failure_kind": "agent_run_error",
    }  # fmt: skip


def token_call(item: dict[str, Any], prompt: int, generated: int) -> dict[str, Any]:
    """``item`` carrying a model call's token data (``return_token_ids``)."""
    return {
        **item,
        "prompt_token_ids": list(range(prompt)),
        "generation_token_ids": list(range(generated)),
        "generation_log_probs": [-0.5] * generated,
    }


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def write_run(
    root: Path,
    tasks: int,
    repeats: int,
    rollouts: list[dict[str, Any]] | None = None,
    failures: list[dict[str, Any]] | None = None,
    status: str | None = "completed",
) -> Path:
    """A run directory: ``tasks`` x ``repeats`` rows; by default one clean rollout each."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [
        {"responses_create_params": {"input": f"q{t}"}, "task_index": t, "rollout_index": r}
        for t in range(tasks)
        for r in range(repeats)
    ]
    write_jsonl(root / "tasks.jsonl", rows)
    if rollouts is None:
        rollouts = [rollout(t, r) for t in range(tasks) for r in range(repeats)]
    write_jsonl(root / "rollouts.jsonl", rollouts)
    write_jsonl(root / "failures.jsonl", failures or [])
    if status is not None:
        (root / "run.json").write_bytes(orjson.dumps({"status": status}))
    return root


def clean_except(root: Path, tasks: int, repeats: int, replace: dict[tuple[int, int], Any],
                 **kwargs: Any) -> Path:  # fmt: skip
    """A clean run whose records at the keys of ``replace`` are the given ones (a record, a
    list of records to write in its place, or None to leave it out)."""
    records: list[dict[str, Any]] = []
    for t in range(tasks):
        for r in range(repeats):
            got = replace.get((t, r), rollout(t, r))
            records += got if isinstance(got, list) else [] if got is None else [got]
    return write_run(root, tasks, repeats, rollouts=records, **kwargs)
