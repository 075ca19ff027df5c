"""What the bundled environments read alike from a task row, and how they sum a verify field
over a run: written once here, so that the environments cannot drift apart in how they read
``expected_answer`` or the prompt, or in what an ``aggregate_metrics`` rate counts."""

from __future__ import annotations

from typing import Any

from rollgym.errors import InvalidRequest


def expected_text(task: dict[str, Any], env: str) -> str:
    """The row's ``expected_answer`` as non-empty text (a number is read as its text); else the
    row is wrong (422), in a message naming the ``env`` that needs it."""
    expected = task.get("expected_answer")
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        expected = str(expected)
    if not isinstance(expected, str) or not expected.strip():
        raise InvalidRequest(f"{env} task needs 'expected_answer' (a non-empty string)", status=422)
    return expected


def prompt_items(task: dict[str, Any]) -> str | list[Any]:
    """The row's prompt (``responses_create_params.input``): a string, or a list of items
    (``[]`` when it is neither)."""
    prompt = (task.get("responses_create_params") or {}).get("input")
    return prompt if isinstance(prompt, (str, list)) else []


def content_texts(content: Any) -> list[str]:
    """The texts of a message's ``content``: itself when it is a string, else the ``text`` of
    each of its parts."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return []


def mean_field(rollouts: list[dict[str, Any]], field: str, name: str) -> dict[str, float]:
    """``{name: mean}`` of the numeric ``field`` over the ``rollouts`` that carry it (``{}``
    when none does): the share of rollouts with a 1 when the field is a 0/1 flag."""
    # A JSON true is an int to Python here, and counts as 1.
    values = [float(r[field]) for r in rollouts if isinstance(r.get(field), (int, float))]
    return {name: sum(values) / len(values)} if values else {}
