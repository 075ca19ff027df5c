"""The tool-calling agent: ``POST /run`` turns one task row into one verified rollout.

    seed_session -> model -> tool calls -> model -> ... (at most max_steps model calls) -> verify

A rollout that runs out of steps is verified as it stands and marked ``truncated``.

A tool's own 4xx answer (bad arguments, unknown key) is the tool's output, handed back to the
model as a ``function_call_output``. An infrastructure failure (model, tool or verify failing
after the called server's retries) fails the rollout with the typed error as ``origin``.
If the caller disconnects, the rollout is cancelled with the requests it has in flight, so
nobody keeps a broken upstream under load for work nobody will read.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollgym.config import Config
from rollgym.errors import ConfigError, HTTPStatusError, InvalidRequest, ProtocolError
from rollgym.http import Target
from rollgym.protocol import HEADER_ROLLOUT, TaskRow, function_calls, rollout_key
from rollgym.server.app import JSONResponse, read_json, until_disconnect
from rollgym.server.base import BaseServer
from rollgym.server.resources import SESSION_HEADER


class ToolAgent(BaseServer):
    """Options: ``model`` and ``resources`` (server names), ``max_steps`` (default 10),
    ``model_timeout``, ``tool_timeout``, ``verify_timeout`` (seconds, per call)."""

    kind: ClassVar[str] = "agent"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        model: str = "model"
        resources: str = "resources"
        max_steps: int = Field(default=10, ge=1, le=1000)
        model_timeout: float = Field(default=600.0, gt=0)
        tool_timeout: float = Field(default=120.0, gt=0)
        verify_timeout: float = Field(default=300.0, gt=0)

    @classmethod
    def check_options(cls, config: Config, name: str) -> None:
        super().check_options(config, name)
        options = cls.Options.model_validate(config.servers[name].options)
        for role in ("model", "resources"):
            peer = getattr(options, role)
            if peer not in config.servers:
                raise ConfigError(
                    f"{config.source or 'config'}: servers.{name}.options.{role}: no server "
                    f"named {peer!r} (known: {', '.join(sorted(config.servers))})"
                )

    async def startup(self) -> None:
        self.model: Target = self.peer(self.option("model", "model"))
        self.resources: Target = self.peer(self.option("resources", "resources"))
        self.max_steps = int(self.option("max_steps", 10))
        if self.max_steps < 1:
            # Zero steps would "verify" a response the model never gave.
            raise ConfigError(f"server {self.name!r}: options.max_steps must be at least 1")
        self.model_timeout = float(self.option("model_timeout", 600.0))
        self.tool_timeout = float(self.option("tool_timeout", 120.0))
        self.verify_timeout = float(self.option("verify_timeout", 300.0))
        self._tools: list[dict[str, Any]] | None = None
        self._tools_lock = asyncio.Lock()

    def add_routes(self, app: FastAPI) -> None:
        app.router.routes.append(Route("/run", self._run_endpoint, methods=["POST"]))

    async def _run_endpoint(self, request: Request) -> Response:
        row = await read_json(request)
        if not isinstance(row, dict):
            raise InvalidRequest("/run expects a task row (a JSON object)", status=422)
        try:
            TaskRow.model_validate(row)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidRequest(f"/run: not a valid task row: {problems}", status=422) from None
        result = await until_disconnect(request, self.run(row, request.headers.get(HEADER_ROLLOUT)))
        return result if isinstance(result, Response) else JSONResponse(result)

    async def _server_tools(self) -> list[dict[str, Any]]:
        # One fetch shared by every rollout that starts before the first answer arrives.
        async with self._tools_lock:
            if self._tools is None:
                tools = await self.client.call(
                    self.resources, "/tools", {}, deadline=self.tool_timeout
                )
                self._tools = tools if isinstance(tools, list) else []
        return self._tools

    async def run(self, row: dict[str, Any], rollout_id: str | None = None) -> dict[str, Any]:
        """Run one rollout of ``row`` and return the verify response. ``rollout_id`` (the
        caller's ``x-rollgym-rollout``) names the rollout to the servers it calls."""
        key = rollout_id or _rollout_id(row)
        headers = {HEADER_ROLLOUT: key}
        seeded = await self.client.call(
            self.resources, "/seed_session", row, headers=headers, deadline=self.tool_timeout,
            sticky=key,
        )  # fmt: skip
        session_id = str(seeded.get("session_id", "")) if isinstance(seeded, dict) else ""
        res_headers = {**headers, SESSION_HEADER: session_id} if session_id else headers

        params = dict(row["responses_create_params"])
        raw_input = params.get("input")
        items: list[Any] = (
            [{"type": "message", "role": "user", "content": raw_input}]
            if isinstance(raw_input, str)
            else list(raw_input or [])
        )
        if not params.get("tools"):
            tools = await self._server_tools()
            if tools:
                params["tools"] = tools

        outputs: list[Any] = []
        response: dict[str, Any] = {}
        turns: list[dict[str, Any]] = []  # every model response, for per-turn token data
        steps = 0
        truncated = False
        started = time.monotonic()
        while steps < self.max_steps:
            steps += 1
            response = await self.client.call(
                self.model, "/v1/responses", {**params, "input": items + outputs},
                headers=headers, deadline=self.model_timeout, sticky=key,
            )  # fmt: skip
            new = response.get("output") if isinstance(response, dict) else None
            if not isinstance(new, list):
                raise ProtocolError(
                    "model response has no 'output' list", server=self.model.name,
                    endpoint="/v1/responses", body=orjson.dumps(response),
                )  # fmt: skip
            outputs.extend(new)
            turns.append(response)
            calls = function_calls(response)
            if not calls:
                break
            declared = _tool_names(params.get("tools"))
            results = await asyncio.gather(
                *(self._call_tool(c, declared, res_headers, key) for c in calls)
            )
            outputs.extend(results)
        else:
            # Out of steps while the model still wanted its tools: the rollout is verified as
            # it stands (a truncated episode is still data), and marked so trainers can tell.
            truncated = True

        final = _final_response(response, outputs, turns)
        verified = await self.client.call(
            self.resources, "/verify", {**row, "response": final},
            headers=res_headers, deadline=self.verify_timeout, sticky=key, pin=bool(session_id),
        )  # fmt: skip
        if isinstance(verified, dict):
            verified.setdefault("num_steps", steps)
            verified.setdefault("truncated", truncated)
            verified.setdefault("agent_seconds", round(time.monotonic() - started, 4))
        return verified  # type: ignore[no-any-return]

    async def _call_tool(
        self, call: dict[str, Any], declared: set[str], headers: dict[str, str], key: str
    ) -> dict[str, Any]:
        name = str(call.get("name", ""))
        raw_args = call.get("arguments") or "{}"
        try:
            args = orjson.loads(raw_args) if isinstance(raw_args, str) else raw_args
        except orjson.JSONDecodeError as exc:
            output = orjson.dumps({"error": f"arguments are not valid JSON: {exc}"}).decode()
            return _tool_output(call, output)
        if name not in declared or not name.isidentifier():
            # Only the task's declared tools are callable: a model must not reach /verify or
            # /seed_session (or any other endpoint) by naming it as a tool.
            return _tool_output(call, orjson.dumps({"error": f"unknown tool {name!r}"}).decode())
        try:
            result = await self.client.call(
                self.resources, f"/{name}", args, headers=headers, deadline=self.tool_timeout,
                sticky=key, pin=SESSION_HEADER in headers,
            )  # fmt: skip
        except HTTPStatusError as err:
            if err.status is not None and 400 <= err.status < 500 and err.status not in (408, 429):
                # The tool refused the call (bad arguments, unknown tool): the model's problem.
                return _tool_output(call, orjson.dumps({"error": err.message}).decode())
            raise
        output = result if isinstance(result, str) else orjson.dumps(result).decode()
        return _tool_output(call, output)


def _final_response(
    last: dict[str, Any], outputs: list[Any], turns: list[dict[str, Any]]
) -> dict[str, Any]:
    """The rollout as one Responses API response: every turn's output, usage summed over the
    turns, and the token-level data a model server attached to each turn (``rollgym_upstream``
    becomes a list, one entry per model call), so a trainer sees every turn it must train on."""
    final = {**last, "output": outputs}
    usages = [t["usage"] for t in turns if isinstance(t.get("usage"), dict)]
    if len(usages) > 1:
        final["usage"] = _sum_usage(usages)
    if any("rollgym_upstream" in t for t in turns):
        final["rollgym_upstream"] = [t.get("rollgym_upstream") for t in turns]
    return final


def _sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str, detail: str | None = None) -> int:
        out = 0
        for u in usages:
            value = (u.get(key) or {}).get(detail) if detail else u.get(key)
            out += value if isinstance(value, int) else 0
        return out

    return {
        "input_tokens": total("input_tokens"),
        "input_tokens_details": {
            "cached_tokens": total("input_tokens_details", "cached_tokens"),
            "cache_write_tokens": total("input_tokens_details", "cache_write_tokens"),
        },
        "output_tokens": total("output_tokens"),
        "output_tokens_details": {
            "reasoning_tokens": total("output_tokens_details", "reasoning_tokens")
        },
        "total_tokens": total("total_tokens"),
    }


def _tool_names(tools: Any) -> set[str]:
    return {
        str(t.get("name") or (t.get("function") or {}).get("name"))
        for t in tools or []
        if isinstance(t, dict)
    }


def _rollout_id(row: dict[str, Any]) -> str:
    if row.get("task_index") is not None and row.get("rollout_index") is not None:
        return rollout_key(row)
    # An unstamped row (a trainer calling /run itself) gets an id of its own: a shared one
    # would pin every such rollout to one replica (sticky balancing) and give them all the
    # same scripted alternative.
    return os.urandom(16).hex()


def _tool_output(call: dict[str, Any], output: str) -> dict[str, Any]:
    # ``id`` and ``status`` make the item a valid output item too: the verified response carries
    # it in its ``output`` list, which must still parse as an OpenAI ``Response``.
    return {
        "type": "function_call_output",
        "id": f"fco_{os.urandom(12).hex()}",
        "call_id": call.get("call_id", ""),
        "output": output,
        "status": "completed",
    }
