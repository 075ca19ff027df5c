"""``MCQAEnv``: multiple-choice questions scored by the option letter the reply chose.

Task fields: ``options`` (a dict letter -> text, or a list whose items are A, B, C, ...) and
``expected_answer`` (a letter). ``extracted`` (1/0) says whether a single choice was found at all,
so a model that answers in an unreadable format shows up apart from one that answers wrongly.
"""

from __future__ import annotations

import string
from typing import Any

from rollgym.envs.mcqa.extract import extract_choice
from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session


def option_letters(options: Any) -> list[str]:
    """The letters of a task's ``options``: a dict's keys, or A, B, C, ... for a list."""
    if isinstance(options, dict) and options:
        letters = [str(k).strip().upper() for k in options]
        if all(len(k) == 1 and k.isalpha() for k in letters):
            return letters
    elif isinstance(options, list) and 0 < len(options) <= 26:
        return list(string.ascii_uppercase[: len(options)])
    raise InvalidRequest(
        "mcqa task needs 'options': a dict of single letters -> text, or a list of at most 26",
        status=422,
    )


class MCQAEnv(ResourcesServer):
    """Multiple-choice QA; reward 1.0 when the extracted letter is ``expected_answer``."""

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, float | int]:
        letters = option_letters(task.get("options"))
        expected = task.get("expected_answer")
        if not isinstance(expected, str) or expected.strip().upper() not in letters:
            raise InvalidRequest(
                f"mcqa task's 'expected_answer' must be one of {', '.join(letters)}, "
                f"got {expected!r}",
                status=422,
            )
        choice = extract_choice(output_text(response), letters)
        reward = 1.0 if choice == expected.strip().upper() else 0.0
        return {"reward": reward, "extracted": int(choice is not None)}

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        flags = [
            float(r["extracted"]) for r in rollouts if isinstance(r.get("extracted"), (int, float))
        ]
        if not flags:
            return {}
        return {"extraction_rate": sum(flags) / len(flags)}


__all__ = ["MCQAEnv", "extract_choice", "option_letters"]
