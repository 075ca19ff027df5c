"""Guess the number: a multi-turn environment served Gymnasium-style (``/reset`` + ``/step``).

Row fields: ``secret`` (an integer from 1 to ``high``), optional ``high`` (default 100). The
reset observation asks for ``<guess>N</guess>``; each step reads the guess from the model's
text. A wrong guess costs 0.1 and answers "higher" or "lower"; an answer without a guess costs
0.1 and asks again; the right guess pays 1.0 and ends the episode. The episode's reward is the
sum: 1.0 for a first-try guess, 0.7 after three wrong ones. Play it with ``gymnasium_agent``,
which bounds the episode with ``max_steps``.

The protocol is NeMo Gym's ``GymnasiumServer``'s, so NeMo Gym's own ``gymnasium_agent`` can play
it too: the session id travels in the ``rollgym_session`` cookie, set again on every answer
(NeMo Gym's agents keep only the latest answer's cookies), or in the ``x-rollgym-session``
header; a session ends with its episode.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar, TypeGuard

from starlette.routing import BaseRoute, Route

from rollgym.errors import InvalidRequest
from rollgym.server.base import BaseServer, ServerContext
from rollgym.server.endpoint import Call, JSONResponse, json_endpoint
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>", re.IGNORECASE)
WRONG = -0.1
RIGHT = 1.0
_MAX_SESSIONS = 100_000  # episodes never finished (abandoned rollouts) fall out oldest first


@dataclass
class Game:
    secret: int
    high: int
    guesses: int = 0


class GuessEnv(BaseServer):
    kind: ClassVar[str] = "resources"
    row_fields = frozenset({"secret", "high"})

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self._games: OrderedDict[str, Game] = OrderedDict()

    @property
    def open_episodes(self) -> int:
        """Episodes reset and not yet won (nor evicted)."""
        return len(self._games)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/reset", json_endpoint(self._reset), methods=["POST"]),
            Route("/step", json_endpoint(self._step), methods=["POST"]),
        ]

    async def _reset(self, row: Any, call: Call) -> Any:
        game = _new_game(row)
        sid = os.urandom(16).hex()
        self._games[sid] = game
        if len(self._games) > _MAX_SESSIONS:
            self._games.popitem(last=False)
        observation = f"I am thinking of a number from 1 to {game.high}. Answer <guess>N</guess>."
        return _answer({"observation": observation, "info": {"high": game.high}}, sid)

    async def _step(self, body: Any, call: Call) -> Any:
        sid = call.headers.get(SESSION_HEADER) or call.cookies.get(SESSION_COOKIE)
        game = self._games.get(sid or "")
        if game is None:
            raise InvalidRequest(
                f"no episode for session {sid!r} (never reset, or over)", status=404
            )
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict):
            raise InvalidRequest("/step expects the task row plus a 'response' object", status=422)
        game.guesses += 1
        found = GUESS.findall(_text(response))
        guess = _number(found[-1], game.high) if found else None  # the last guess counts
        if guess is None:
            step = _step("Answer with <guess>N</guess>.", WRONG)
        elif guess == game.secret:
            del self._games[sid or ""]
            step = _step(None, RIGHT, terminated=True, info={"guesses": game.guesses})
        else:
            hint = "higher" if guess < game.secret else "lower"
            step = _step(f"{hint}. Guess again.", WRONG)
        return _answer(step, sid or "")


def _new_game(row: Any) -> Game:
    if not isinstance(row, dict):
        raise InvalidRequest("/reset expects the task row as a JSON object", status=422)
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


def _step(
    observation: str | None,
    reward: float,
    *,
    terminated: bool = False,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "observation": observation,
        "reward": reward,
        "terminated": terminated,
        "truncated": False,
        "info": info or {},
    }


def _text(response: dict[str, Any]) -> str:
    # Every message's text, as NeMo Gym's extract_text joins it.
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


def _answer(body: dict[str, Any], sid: str) -> JSONResponse:
    cookie = f"{SESSION_COOKIE}={sid}; Path=/; HttpOnly; SameSite=lax"
    return JSONResponse(body, headers={"set-cookie": cookie})
