"""The agent's side of a resources server: one ``Episode`` per rollout owns its session.

    resources = ResourcesClient(http, target)
    episode = resources.episode(rollout_key)
    await episode.seed(row)
    output = await episode.call_tool("lookup", {"key": "QX-4471"})
    verified = await episode.verify(row, response)

An episode carries the session both ways a server may keep it: the ``x-rollgym-session`` header
(from ``/seed_session``'s answer) and every cookie the server sets (a server may keep its session in
a signed cookie named after the server). Its calls stay on the replica that holds the session
(sticky, then pinned once there is a session). Cookies live in the episode only, so a session never
reaches another rollout.

A ``Grant`` is a session someone else seeded (an environment server seeds the resources and grants
an agent session ``direct_http`` access: a base URL, cookies, headers): an episode resumed from it
calls that server's tools with those cookies and headers, and keeps the cookies the server sets in
the grant, for the caller to read back when the session closes.

An episode also holds its rollout's tool-call budget, so every path that runs a model's tool
calls (the tool agent, an agent-session turn, verifiers' MCP tools, an OpenEnv client of
``serve-openenv``) is bounded in one place: at most ``max_tool_calls`` calls (default
``MAX_TOOL_CALLS``); a call past them is answered ``SPENT`` and never sent. ``call_tool`` takes
one call from the budget; an agent that answers a whole model message at once takes its share
first (``take_calls``) and sends each with ``send_tool``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import orjson

from rollgym.errors import ConfigError, HTTPStatusError, ProtocolError
from rollgym.http import HttpClient, JsonValue, Target
from rollgym.protocol import is_tool_name, tool_error
from rollgym.wire import HEADER_ROLLOUT, SESSION_HEADER

MAX_TOOL_CALLS = 256
"""The tool calls a rollout sends at most unless told otherwise (``Episode.max_tool_calls``,
the tool agent's ``max_tool_calls``)."""

NOT_RUN = "not run: "
"""How the answer to a call refused for a budget begins (``tool_error``): a replay of the
rollout (``rollgym reverify``) leaves those calls out too."""
SPENT = NOT_RUN + "the rollout's {} tool calls (max_tool_calls) are spent"


class ResourcesClient:
    """Calls to one resources server for every rollout of an agent; ``episode`` per rollout."""

    def __init__(
        self,
        http: HttpClient,
        target: Target,
        *,
        tool_timeout: float = 120.0,
        verify_timeout: float = 300.0,
    ) -> None:
        self.http = http
        self.target = target
        self.tool_timeout = tool_timeout
        self.verify_timeout = verify_timeout
        self._tools: list[dict[str, Any]] | None = None
        self._tools_lock = asyncio.Lock()

    def episode(self, rollout: str) -> Episode:
        """A new episode for the rollout ``rollout`` (its ``x-rollgym-rollout`` id)."""
        return Episode(self, rollout)

    async def tools(self) -> list[dict[str, Any]]:
        """The server's tools as Responses API function tools (fetched once, then cached)."""
        # One fetch shared by every rollout that starts before the first answer arrives.
        async with self._tools_lock:
            if self._tools is None:
                tools = await self.http.call_json(
                    self.target, "/tools", {}, deadline=self.tool_timeout
                )
                self._tools = [t for t in tools if isinstance(t, dict)] if isinstance(
                    tools, list
                ) else []  # fmt: skip
        return self._tools


class Episode:
    """One rollout's session on a resources server. ``cookies`` (default: a jar of its own) is
    the jar it sends and fills; ``headers`` go on every call besides rollgym's own."""

    def __init__(
        self,
        resources: ResourcesClient,
        rollout: str,
        *,
        cookies: dict[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        max_tool_calls: int = MAX_TOOL_CALLS,
    ) -> None:
        self.resources = resources
        self.rollout = rollout
        self.session_id: str | None = None
        self.cookies: dict[str, str] = {} if cookies is None else cookies
        self.headers: Mapping[str, str] = headers or {}
        self.max_tool_calls = max_tool_calls
        self.tool_calls = 0
        """Calls taken from the budget so far (a caller that keeps the count elsewhere between
        episodes of one rollout, as verifiers' state does, sets it back)."""

    async def seed(self, row: dict[str, Any]) -> None:
        """Open the session for task ``row`` (``/seed_session``)."""
        seeded = await self.post("/seed_session", row, self.resources.tool_timeout)
        sid = seeded.get("session_id") if isinstance(seeded, dict) else None
        if isinstance(sid, str) and sid:
            self.session_id = sid

    async def tools(self) -> list[dict[str, Any]]:
        return await self.resources.tools()

    def take_calls(self, wanted: int) -> int:
        """Take up to ``wanted`` tool calls from the rollout's budget: how many it granted."""
        granted = max(0, min(wanted, self.max_tool_calls - self.tool_calls))
        self.tool_calls += granted
        return granted

    async def call_tool(self, name: str, arguments: Any) -> str:
        """The output of tool ``name`` for the model, one call of the rollout's budget (past
        it, ``SPENT``, unsent). A refusal (a 4xx: bad arguments, unknown key) is the tool's
        answer, ``{"error": message}``; a failing server raises."""
        if not self.take_calls(1):
            return tool_error(SPENT.format(self.max_tool_calls))
        return await self.send_tool(name, arguments)

    async def send_tool(self, name: str, arguments: Any) -> str:
        """``call_tool`` for a call already taken from the budget (``take_calls``)."""
        if not is_tool_name(name):
            # A model must not reach /verify, /seed_session or anything but a tool by naming
            # it as one (``__init__``, a fullwidth ``verify``).
            return tool_error(f"unknown tool {name!r}")
        try:
            result = await self.post(f"/{name}", arguments, self.resources.tool_timeout)
        except HTTPStatusError as err:
            if err.status is not None and 400 <= err.status < 500 and err.status not in (408, 429):
                return tool_error(err.message)
            raise
        return result if isinstance(result, str) else orjson.dumps(result).decode()

    async def verify(self, row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        """Score ``response`` for ``row`` (``/verify``): the verify response with ``reward``."""
        verified = await self.post(
            "/verify", {**row, "response": response}, self.resources.verify_timeout
        )
        if not isinstance(verified, dict):
            raise ProtocolError(
                "verify answered something other than a JSON object",
                server=self.resources.target.name, endpoint="/verify",
                body=orjson.dumps(verified),
            )  # fmt: skip
        return verified

    async def post(self, endpoint: str, payload: Any, deadline: float) -> JsonValue:
        """POST ``payload`` to ``endpoint`` within this rollout's session (its header, its
        cookies, its replica): for endpoints beyond seed/tools/verify (``/reset``, ``/step``)."""
        headers = {**self.headers, HEADER_ROLLOUT: self.rollout}
        if self.session_id:
            headers[SESSION_HEADER] = self.session_id
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        # Pinned once a session exists: its state lives on the replica that seeded it.
        pin = bool(self.session_id or self.cookies)
        answer, cookies = await self.resources.http.call_with_cookies(
            self.resources.target, endpoint, payload, headers=headers, deadline=deadline,
            sticky=self.rollout, pin=pin,
        )  # fmt: skip
        self.cookies.update(cookies)
        return answer


@dataclass
class Grant:
    """Access to a resources session another server seeded: the server (``None``: no access
    was granted), the session's cookie jar (filled by every answer, read back at the end) and
    the headers to send. An episode resumed from it shares the jar (``Episode(cookies=...)``)."""

    resources: ResourcesClient | None
    cookies: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


class Ungranted(Episode):
    """The episode of a session granted no resources: no tools to offer, and a call to one is
    the granting server's configuration error (the model must not be told a tool is missing
    that the task declares)."""

    def __init__(self, rollout: str) -> None:  # no server to hold: every call is refused
        self.rollout = rollout
        self.session_id = None
        self.cookies = {}
        self.headers = {}
        self.max_tool_calls = MAX_TOOL_CALLS
        self.tool_calls = 0

    async def seed(self, row: dict[str, Any]) -> None:
        self._refuse("/seed_session")

    async def tools(self) -> list[dict[str, Any]]:
        return []

    async def send_tool(self, name: str, arguments: Any) -> str:
        self._refuse(f"tool {name!r}")

    async def verify(self, row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        self._refuse("/verify")

    async def post(self, endpoint: str, payload: Any, deadline: float) -> JsonValue:
        self._refuse(endpoint)

    def _refuse(self, what: str) -> NoReturn:
        raise ConfigError(
            f"rollout {self.rollout}: {what} called in an agent session that was granted no "
            "resources access (the environment server grants one with a direct_http tool "
            "access: resources_tool_transports: [direct_http] in NeMo Gym 0.7)"
        )
