"""The letters environment: "Reply with the letter B." A toy task a random-weight model can
learn with GRPO in minutes, because its reward is graded rather than all-or-nothing.

Row field ``letter`` (one character). The reward is the share of the reply's non-space
characters that are the letter: ``B`` and ``BBB`` pay 1.0, ``xB`` 0.5, an empty reply 0.0. The
metric ``exact`` is 1.0 when the reply, stripped, is the letter alone.
"""

from __future__ import annotations

from typing import Any

from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session


class Letters(ResourcesServer):
    row_fields = frozenset({"letter"})
    reverify_mode = "stateless"  # verify reads the row and the reply

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, float]:
        letter = task.get("letter")
        if not isinstance(letter, str) or len(letter) != 1:
            raise InvalidRequest(f"letter must be one character, not {letter!r}", status=422)
        text = "".join(output_text(response).split())
        reward = sum(ch == letter for ch in text) / len(text) if text else 0.0
        return {"reward": reward, "exact": float(text == letter)}


def letter_row(letter: str, *, max_tokens: int, temperature: float) -> dict[str, Any]:
    """The task row asking for ``letter``."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": f"Reply with the letter {letter}."}],
            "max_output_tokens": max_tokens,
            "temperature": temperature,
        },
        "letter": letter,
    }
