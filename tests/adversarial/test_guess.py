"""Red team: guesses a policy under training may send to the guess env, against a real server.

- A guess of more than 4,300 digits made ``int()`` raise, so ``/step`` answered 500 and the
  episode failed; now any number of digits is a wrong guess with its hint.
- Many guesses in one turn: only the last counts (as a final answer does), so listing every
  number does not win; pinned here (it held before this suite too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from rollgym.envs.guess.server import GuessEnv
from rollgym.testing import serve_server
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER
from tests.envs.env_client import reply

pytestmark = pytest.mark.timeout(60)
ROW = {"responses_create_params": {"input": "Let's play."}, "secret": 42, "high": 100}


class Episode:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url, self.sid = http, url, ""

    async def reset(self) -> None:
        async with self.http.post(self.url + "/reset", json=ROW) as resp:
            assert resp.status == 200
            self.sid = resp.cookies[SESSION_COOKIE].value

    async def step(self, text: str) -> tuple[int, Any]:
        body = {**ROW, "response": reply(text)}
        headers = {SESSION_HEADER: self.sid}
        async with self.http.post(self.url + "/step", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


@asynccontextmanager
async def _episode() -> AsyncIterator[Episode]:
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    async with (
        serve_server(GuessEnv, name="guess") as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        episode = Episode(http, url)
        await episode.reset()
        yield episode


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("<guess>" + "9" * 100_000 + "</guess>", "lower"),
        ("<guess>-" + "9" * 100_000 + "</guess>", "higher"),
        ("<guess>" + "0" * 100_000 + "41</guess>", "higher"),  # leading zeros: still 41
        ("<guess>99999999999999999999999</guess>", "lower"),
    ],
)
async def test_a_guess_of_any_length_is_a_wrong_guess_not_a_500(text: str, hint: str) -> None:
    async with _episode() as episode:
        status, body = await episode.step(text)
        assert status == 200, body
        assert (body["reward"], body["terminated"]) == (-0.1, False)
        assert body["observation"].startswith(hint)
        status, body = await episode.step("<guess>42</guess>")  # the episode goes on
        assert status == 200 and body["reward"] == 1.0 and body["terminated"]


@pytest.mark.parametrize(
    "text",
    [
        "".join(f"<guess>{n}</guess>" for n in range(1, 101)),
        "<guess>42</guess> no wait <guess>7</guess>",
        "\x00<guess>\x0042</guess>",
        "<guess>42.0</guess>",
    ],
)
async def test_listing_guesses_or_odd_text_does_not_win(text: str) -> None:
    async with _episode() as episode:
        status, body = await episode.step(text)
        assert status == 200, body
        assert body["reward"] == -0.1 and not body["terminated"]
