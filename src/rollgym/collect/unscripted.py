"""Task rows the scripted model has no script for, said once when a run starts.

The scripted model (``rollgym.models.scripted``) is a stand-in, not a language model: it follows
each row's ``metadata.rollgym_script``. A row without one gets its fallback (the first declared
tool called with the user's text, then the tool's output said back; with no tools, a fixed
sentence), which a verifier almost always scores 0. Nothing fails, so a run of such rows looks
healthy while every group's rewards are equal (``rollgym health``'s ``no_signal_groups``).

Only a run whose every model server is the scripted one is checked: with a real model beside
it, a row without a script may be meant for that one. A row counts as scripted when its line
names ``rollgym_script`` at all (a byte search; the line is parsed only if it does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.tasks import iter_rollouts
from rollgym.config import Config
from rollgym.server.base import BUILTIN_IMPLS

SCRIPT_KEY = "rollgym_script"
ROWS_SHOWN = 5
_SCRIPTED = frozenset({"scripted", BUILTIN_IMPLS["scripted"]})


def scripted_models(config: Config) -> list[str]:
    """The model servers of ``config`` if every one is the scripted model, else none."""
    models = [(n, s) for n, s in config.servers.items() if s.kind == "model"]
    if not models or any(s.impl not in _SCRIPTED for _, s in models):
        return []
    return [n for n, _ in models]


def _has_script(raw: bytes) -> bool:
    if SCRIPT_KEY.encode() not in raw:
        return False
    row: Any = orjson.loads(raw)
    params = row.get("responses_create_params") if isinstance(row, dict) else None
    metadata = params.get("metadata") if isinstance(params, dict) else None
    if isinstance(metadata, dict):
        return metadata.get(SCRIPT_KEY) is not None
    return True  # named somewhere else (a materialized row's task): taken at its word


def unscripted_rows(tasks: Path) -> tuple[int, int, list[int]]:
    """(rows without a script, rows, the first ``ROWS_SHOWN`` task indices without) of a
    run's ``tasks.jsonl`` (each task once: its first repeat)."""
    missing, rows = 0, 0
    first: list[int] = []
    for task_index, rollout_index, raw in iter_rollouts(tasks):
        if rollout_index != 0:
            continue
        rows += 1
        if not _has_script(raw):
            missing += 1
            if len(first) < ROWS_SHOWN:
                first.append(task_index)
    return missing, rows, first


def unscripted_warning(config: Config, tasks: Path) -> str | None:
    """The run's warning about rows without a script, or None (no such row, or a real model
    in the run)."""
    models = scripted_models(config)
    if not models:
        return None
    missing, rows, first = unscripted_rows(tasks)
    if not missing:
        return None
    shown = ", ".join(map(str, first)) + (" ..." if missing > len(first) else "")
    servers = ", ".join(f"servers.{n}" for n in models)
    return (
        f"{missing} of {rows} task rows (tasks {shown}) have no metadata.{SCRIPT_KEY} for the "
        f"scripted model ({servers}), a stand-in, not a language model: without a script it "
        "calls the row's first tool with the user's text and says the output back, which a "
        "verifier almost always scores 0 (no learning signal, and nothing fails). Give each row "
        "a script (`rollgym tasks reasoning-gym --scripted` writes one), or serve a real model "
        "(impl: openai_proxy)."
    )
