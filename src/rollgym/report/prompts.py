"""A few tasks' prompts, as short excerpts: what the hardest tasks asked, beside their indices.

Read from the run's ``tasks.jsonl`` in one streaming pass, parsing only the first row of each
wanted task; the excerpt is the first user message's text, whitespace folded, cut at
``EXCERPT`` characters. It is plain text: whoever shows it escapes it (the page does).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.layout import RunDir
from rollgym.collect.tasks import iter_rollouts
from rollgym.errors import RollgymError

EXCERPT = 100
"""Characters of a prompt shown (the rest is cut, marked with an ellipsis)."""


def first_user_text(row: Any) -> str:
    """The text of a task row's first user message (``responses_create_params.input``: a
    string, or a list of items); empty when it has none."""
    params = row.get("responses_create_params") if isinstance(row, dict) else None
    given = params.get("input") if isinstance(params, dict) else None
    if isinstance(given, str):
        return given
    for item in given if isinstance(given, list) else ():
        if isinstance(item, dict) and item.get("role") == "user":
            return _text(item.get("content"))
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else ()
    return " ".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def excerpt(text: str, limit: int = EXCERPT) -> str:
    folded = " ".join(text[: limit * 4].split())  # a huge prompt is never folded whole
    return folded if len(folded) <= limit else folded[: limit - 1].rstrip() + "…"


def prompt_excerpts(root: Path, tasks: Collection[int]) -> dict[int, str]:
    """The excerpt of each of ``tasks``' prompt in the run at ``root`` (none for a task whose
    row cannot be read: a report shows what it can)."""
    wanted = set(tasks)
    out: dict[int, str] = {}
    if not wanted:
        return {}
    try:
        for task_index, _, raw in iter_rollouts(RunDir(root).tasks):
            if task_index in wanted and task_index not in out:
                out[task_index] = excerpt(first_user_text(orjson.loads(raw)))
                if len(out) == len(wanted):
                    break
    except (RollgymError, orjson.JSONDecodeError):
        pass  # a missing or damaged tasks.jsonl: the page shows the indices alone
    return out
