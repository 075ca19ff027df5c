"""Guess the number: a multi-turn environment served Gymnasium-style (``/reset`` + ``/step``).

Row fields: ``secret`` (an integer from 1 to ``high``), optional ``high`` (default 100). The reset
observation asks for ``<guess>N</guess>``; each step reads the guess from the model's text. A wrong
guess costs 0.1 and answers "higher" or "lower"; an answer without a guess costs 0.1 and asks again;
the right guess pays 1.0 and ends the episode. The episode's reward is the sum: 1.0 for a first-try
guess, 0.1 less for each wrong one before it. Play it with ``gymnasium_agent``, which bounds the
episode with ``max_steps``.

The protocol is ``rollgym.server.gymnasium``'s, so NeMo Gym's own ``gymnasium_agent`` can play it
too; a session ends with its episode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from rollgym.errors import InvalidRequest
from rollgym.server.gymnasium import GymnasiumServer, Reset, Session, Step

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>", re.IGNORECASE)
WRONG = -0.1
RIGHT = 1.0


@dataclass
class Game:
    secret: int
    high: int
    guesses: int = 0


class GuessEnv(GymnasiumServer):
    row_fields = frozenset({"secret", "high"})

    async def reset(self, session: Session) -> Reset:
        game = session.data["game"] = _new_game(session.task)
        observation = f"I am thinking of a number from 1 to {game.high}. Answer <guess>N</guess>."
        return Reset(observation, {"high": game.high})

    async def step(self, session: Session, response: dict[str, Any]) -> Step:
        game: Game = session.data["game"]
        game.guesses += 1
        found = GUESS.findall(_text(response))
        guess = _number(found[-1], game.high) if found else None  # the last guess counts
        if guess is None:
            return Step("Answer with <guess>N</guess>.", WRONG)
        if guess == game.secret:
            return Step(None, RIGHT, terminated=True, info={"guesses": game.guesses})
        hint = "higher" if guess < game.secret else "lower"
        return Step(f"{hint}. Guess again.", WRONG)


def _new_game(row: dict[str, Any]) -> Game:
    secret, high = row.get("secret"), row.get("high", 100)
    if _is_int(secret) and _is_int(high) and 1 <= secret <= high:
        return Game(secret=secret, high=high)
    raise InvalidRequest(
        f"guess needs an integer 'secret' from 1 to 'high' (got {secret!r}, {high!r})",
        status=422,
    )


def _number(digits: str, high: int) -> int:
    """The guess ``digits`` says, without converting a number of any length: one far outside
    1..``high`` only has to compare as such (``int()`` refuses past 4,300 digits)."""
    negative = digits.startswith("-")
    magnitude = digits.lstrip("-").lstrip("0") or "0"
    if len(magnitude) > len(str(high)) + 1:
        return -1 if negative else high + 1
    return -int(magnitude) if negative else int(magnitude)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number


def _text(response: dict[str, Any]) -> str:
    # Every message's text, joined.
    parts: list[str] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            content = item.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    str(c.get("text", ""))
                    for c in content
                    if isinstance(c, dict) and c.get("type") == "output_text"
                )
    return "".join(parts)
