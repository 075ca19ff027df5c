"""Talk to a real env server over HTTP, as the agent does."""

from __future__ import annotations

from typing import Any

import aiohttp
from openai.types.responses import Response

from rollgym.wire import SESSION_HEADER


def reply(text: str) -> dict[str, Any]:
    """A Responses API response whose final assistant message says ``text``."""
    response = {
        "id": "resp_test",
        "object": "response",
        "created_at": 0,
        "model": "test",
        "status": "completed",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "message",
                "id": "msg_test",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }
    Response.model_validate(response)  # the shape the agent really sends
    return response


class EnvClient:
    """``/seed_session``, tools and ``/verify`` of one env server."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def request(
        self, method: str, path: str, body: Any = None, session_id: str | None = None
    ) -> tuple[int, Any]:
        headers = {SESSION_HEADER: session_id} if session_id else {}
        async with self.http.request(method, self.url + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    async def seed(self, task: dict[str, Any]) -> str:
        status, body = await self.request("POST", "/seed_session", task)
        assert status == 200, body
        return str(body["session_id"])

    async def call(
        self, tool: str, arguments: Any, session_id: str | None = None
    ) -> tuple[int, Any]:
        return await self.request("POST", f"/{tool}", arguments, session_id)

    async def verify(
        self, task: dict[str, Any], text: str, session_id: str | None = None
    ) -> tuple[int, Any]:
        return await self.request("POST", "/verify", {**task, "response": reply(text)}, session_id)
