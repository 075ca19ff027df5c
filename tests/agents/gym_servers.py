"""Gymnasium-style environments served the way NeMo Gym 0.4 serves them, for the agent's tests.

NeMo Gym's ``GymnasiumServer`` keeps its session id in Starlette's signed session cookie (named
after the server, set again on every answer), answers ``/reset`` with ``{observation, info}``
and ``/step`` with ``{observation, reward, terminated, truncated, info}``, gives ``step`` the
row's other fields as metadata, and drops the session once a step ends the episode. These
servers are written from those facts (not copied), as plain Starlette apps.

- ``NemoGuessEnv``: guess-the-number. Row fields: ``secret``; optional ``fail_at_step`` (that step
  answers 500), ``bad_step`` (that JSON object is answered as a step). Each wrong guess costs
  0.1 and says "higher"/"lower"; the right one pays 1.0 and ends the episode; "I give up" ends
  it truncated; a ``hint`` function call gets a tool output and no observation.
- ``FollowUpEnv``: NeMo Gym's example_multi_turn_gymnasium game (row ``follow_ups``,
  ``expected_answer``): one follow-up per step, then 1.0 if the answer contains the expected
  text.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.nemo_session import SignedSession


def response_text(response: dict[str, Any]) -> str:
    """Every ``output_text`` of the response's messages, joined (NeMo Gym's ``extract_text``)."""
    parts: list[str] = []
    for item in response.get("output") or []:
        if item.get("type") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(c["text"] for c in content or [] if c.get("type") == "output_text")
    return "".join(parts)


class GymEnv:
    """A NeMo Gym style Gymnasium server: override ``reset`` and ``step``; ``self.app`` serves."""

    def __init__(self, name: str) -> None:
        self.state: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()
        self.sessions_seen: list[str] = []  # session id of every request, in arrival order
        self.step_bodies: list[dict[str, Any]] = []
        routes = [
            Route("/reset", self._reset, methods=["POST"]),
            Route("/step", self._step, methods=["POST"]),
        ]
        self.app = SignedSession(Starlette(routes=routes), f"{type(self).__name__}___{name}")

    async def reset(self, metadata: dict[str, Any], sid: str) -> tuple[str | None, dict[str, Any]]:
        return None, {}

    async def step(self, response: dict[str, Any], metadata: dict[str, Any], sid: str) -> Any:
        raise NotImplementedError

    async def _reset(self, request: Request) -> JSONResponse:
        self.calls["reset"] += 1
        sid = request.session["session_id"]
        self.sessions_seen.append(sid)
        body = await request.json()
        observation, info = await self.reset(_metadata(body), sid)
        return JSONResponse({"observation": observation, "info": info})

    async def _step(self, request: Request) -> JSONResponse:
        self.calls["step"] += 1
        sid = request.session["session_id"]
        self.sessions_seen.append(sid)
        body = await request.json()
        self.step_bodies.append(body)
        await asyncio.sleep(0.01)  # let concurrent episodes interleave
        result = await self.step(body["response"], _metadata(body), sid)
        if isinstance(result, JSONResponse):
            return result
        observation, reward, terminated, truncated, info = result
        if terminated or truncated:
            self.state.pop(sid, None)  # as NeMo Gym's close_session
        return JSONResponse(
            {
                "observation": observation,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "info": info,
            }
        )


class NemoGuessEnv(GymEnv):
    async def reset(self, metadata: dict[str, Any], sid: str) -> tuple[str | None, dict[str, Any]]:
        self.state[sid] = {"secret": int(metadata["secret"]), "steps": 0}
        return "Guess my number from 1 to 100. Answer <guess>N</guess>.", {"low": 1, "high": 100}

    async def step(self, response: dict[str, Any], metadata: dict[str, Any], sid: str) -> Any:
        state = self.state.get(sid)
        if state is None:  # a step outside any episode: a session mix-up
            return JSONResponse({"detail": f"no episode for session {sid}"}, status_code=400)
        state["steps"] += 1
        if metadata.get("fail_at_step") == state["steps"]:
            return JSONResponse({"detail": "environment exploded"}, status_code=500)
        if metadata.get("bad_step") and state["steps"] == 1:
            return JSONResponse(metadata["bad_step"])
        calls = [i for i in response["output"] if i.get("type") == "function_call"]
        if calls:
            parity = "even" if state["secret"] % 2 == 0 else "odd"
            outputs = [
                {"call_id": c["call_id"], "output": orjson.dumps(f"it is {parity}").decode()}
                for c in calls
            ]
            return None, 0.0, False, False, {"tool_outputs": outputs}
        text = response_text(response)
        if "give up" in text:
            return None, 0.0, False, True, {"result": "gave_up"}
        found = re.search(r"<guess>\s*(\d+)\s*</guess>", text)
        guess = int(found.group(1)) if found else None
        if guess == state["secret"]:
            return None, 1.0, True, False, {"result": "win", "steps": state["steps"]}
        hint = "higher" if guess is None or guess < state["secret"] else "lower"
        return f"{hint}. Guess again.", -0.1, False, False, {}


class FollowUpEnv(GymEnv):
    async def reset(self, metadata: dict[str, Any], sid: str) -> tuple[str | None, dict[str, Any]]:
        self.state[sid] = {"turn": 0}
        return None, {}

    async def step(self, response: dict[str, Any], metadata: dict[str, Any], sid: str) -> Any:
        follow_ups = metadata.get("follow_ups", [])
        state = self.state.setdefault(sid, {"turn": 0})
        if state["turn"] < len(follow_ups):
            state["turn"] += 1
            return follow_ups[state["turn"] - 1], 0.0, False, False, {}
        expected = str(metadata.get("expected_answer", ""))
        text = response_text(response)
        return None, float(bool(expected) and expected.lower() in text.lower()), True, False, {}


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    # NeMo Gym passes the row's fields other than responses_create_params (and response).
    return {k: v for k, v in body.items() if k not in ("responses_create_params", "response")}
