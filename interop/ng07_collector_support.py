"""rollgym's collector driving NeMo Gym 0.7's Environment Servers: the 0.7 stack, the rows, and
``rollgym collect`` against it (``test_ng07_collector_drives.py``).

The stack (``gym env start``, offline, through ``conftest.ng07_stack``): 0.7's ``mcqa``
resources server; ``mcqa_simple_agent`` in front of it, fronted by the ``legacy_agent`` relay
0.7 generates for it (``mcqa_environment_server``, explicit here, on a port of ours);
``mcqa_session_agent``, a second ``simple_agent``, behind 0.7's ``single_agent_turn``
(``mcqa_single_agent_turn``). Every model call goes to rollgym's scripted model through 0.7's
``openai_model``.

The rows, in one file: mcqa's own example rows scripted to answer right, wrong and right, and
one whose model call fails (the scripted model refuses its script: 400, which 0.7's
``openai_model`` turns into a 500); each as a flat row naming ``mcqa_simple_agent`` (to the
relay) and as a materialized row of taskset ``mcqa:example`` (to ``single_agent_turn``).
"""

from __future__ import annotations

import copy
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interop import nemo
from interop.nemo import NG07, RESOURCES, free_port
from interop.rollgym_side import ROLLGYM, read_jsonl, write_config, write_jsonl
from interop.rollouts import example_rows, scripted

RELAY = "mcqa_environment_server"  # 0.7's name for the relay in front of mcqa_simple_agent
EPISODES = "mcqa_single_agent_turn"
TASKSET = "mcqa:example"
FAILS = "the model call fails"

Key = tuple[int, int]


def stack_config() -> dict[str, Any]:
    """The 0.7 stack (``policy_model`` is added by ``ng07_stack``; the relay by ``GymStack``)."""
    return {
        "mcqa": nemo.server_entry(
            RESOURCES, "mcqa", free_port(), grading_mode=None, domain="knowledge"
        ),
        "mcqa_simple_agent": nemo.simple_agent(free_port(), "mcqa"),
        "mcqa_session_agent": nemo.simple_agent(free_port(), "mcqa"),
        EPISODES: nemo.single_agent_turn(free_port(), "mcqa", "mcqa_session_agent"),
    }


def mcqa_rows() -> tuple[list[dict[str, Any]], list[float | str]]:
    """Four flat mcqa rows, and what each does: rewards 1, 0, 1, then a failing model call."""
    base = example_rows("mcqa", gym=NG07)[:3]
    rows, expected = [], []
    for i, row in enumerate(base):
        right = row["expected_answer"]
        answer = right if i != 1 else next(x for x in "ABCD" if x != right)
        rows.append(scripted(row, [{"say": f"\\boxed{{{answer}}}"}]))
        expected.append(1.0 if i != 1 else 0.0)
    broken = copy.deepcopy(base[0])
    broken["responses_create_params"].setdefault("metadata", {})["rollgym_script"] = "not a script"
    return [*rows, broken], [*expected, FAILS]


def task_rows() -> tuple[list[dict[str, Any]], dict[Key, float | str]]:
    """The flat rows (naming ``mcqa_simple_agent``), then the same rows materialized, each with
    its ``_ng_task_index`` (both collectors number them alike); and what each task does."""
    rows, expected = mcqa_rows()
    out: list[dict[str, Any]] = []
    does: dict[Key, float | str] = {}
    for row, outcome in zip(rows, expected, strict=True):
        index = len(out)
        out.append({**row, "agent_ref": {"name": "mcqa_simple_agent"}, "_ng_task_index": index})
        does[(index, 0)] = outcome
    for i, (row, outcome) in enumerate(zip(rows, expected, strict=True)):
        index = len(out)
        task_id = {"taskset": TASKSET, "task_id": f"mcqa-{i}"}
        out.append({"task_id": task_id, "task_input": row, "_ng_task_index": index})
        does[(index, 0)] = outcome
    return out, does


def rollgym_config(urls: dict[str, str]) -> dict[str, Any]:
    """rollgym's config: the two Environment Servers by URL; flat rows naming 0.7's agent go to
    its relay, ``mcqa:example`` rows to ``single_agent_turn``."""
    return {
        "servers": {
            RELAY: {"kind": "environment", "url": urls[RELAY]},
            EPISODES: {
                "kind": "environment",
                "url": urls[EPISODES],
                "retry": {"backoff_initial": 0.2, "backoff_max": 1.0},
            },
        },
        "collect": {
            "concurrency": 4,
            "rollout_timeout": 300,
            "agent_aliases": {"mcqa_simple_agent": RELAY},
            "taskset_routes": {TASKSET: EPISODES},
            "max_failure_rate": None,  # the failing rows are a quarter of the run, on purpose
        },
    }


@dataclass
class CollectRun:
    """One ``rollgym collect``: exit code, console output, and its run directory."""

    code: int
    output: str
    out: Path

    @property
    def rollouts(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out / "rollouts.jsonl")

    @property
    def failures(self) -> list[dict[str, Any]]:
        return read_jsonl(self.out / "failures.jsonl")

    def by_key(self) -> dict[Key, dict[str, Any]]:
        """Every record, success or failure, by ``(_ng_task_index, _ng_rollout_index)``."""
        records = self.rollouts + self.failures
        return {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in records}


def rollgym_collect(
    urls: dict[str, str], rows: list[dict[str, Any]], root: Path, *extra: str
) -> CollectRun:
    """``rollgym collect`` of ``rows`` against the 0.7 stack at ``urls``, as a user runs it."""
    root.mkdir(parents=True, exist_ok=True)
    config = write_config(root / "rollgym.yaml", rollgym_config(urls))
    tasks = write_jsonl(root / "tasks.jsonl", rows)
    out = root / "out"
    done = subprocess.run(
        [ROLLGYM, "collect", str(config), "--input", str(tasks), "--output", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    (root / "rollgym-collect.log").write_text(done.stdout + done.stderr)
    return CollectRun(done.returncode, (done.stdout + done.stderr)[-6000:], out)


def error_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A rollgym failure record's error and its origins, flattened (outermost wins)."""
    fields: dict[str, Any] = {}
    error: Any = record.get("error")
    while isinstance(error, dict):
        for key, value in error.items():
            fields.setdefault(key, value)
        error = error.get("origin")
    return fields
