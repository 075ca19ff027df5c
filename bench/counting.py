"""rollgym's servers with a request counter, for the benchmarks' counting passes only.

Each class is the stock server plus a pure-ASGI middleware that counts requests per path,
remembers when each path was first requested (wall clock) and answers ``GET /_bench/stats``.
If ``ROLLGYM_BENCH_EVENTS`` names a file, the first request of each path appends a line
``<server> <path> <unix time>`` to it (used to time ``rollgym run`` to its first dispatch).
Timed passes run the stock servers; these only count hops. Loaded by the launcher as
``impl: counting:CountingAgent`` etc., with ``bench/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import orjson
from fastapi import FastAPI

from rollgym.agents.tool_agent import ToolAgent
from rollgym.envs.echo.server import EchoEnv
from rollgym.models.proxy import OpenAIProxy
from rollgym.models.scripted import ScriptedModel
from rollgym.server.base import BaseServer

STATS_PATH = "/_bench/stats"
EVENTS_ENV = "ROLLGYM_BENCH_EVENTS"


class CountingMiddleware:
    def __init__(self, app: Any, server: str) -> None:
        self.app = app
        self.server = server
        self.counts: Counter[str] = Counter()
        self.first_seen: dict[str, float] = {}
        self.events = os.environ.get(EVENTS_ENV)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == STATS_PATH:
            body = orjson.dumps({"counts": dict(self.counts), "first_seen": self.first_seen})
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if path != "/health":
            self.counts[path] += 1
            if path not in self.first_seen:
                now = self.first_seen[path] = time.time()
                if self.events:
                    # Once per path and process: not worth a thread, and never on the hot path.
                    with open(self.events, "a") as fh:  # noqa: ASYNC230
                        fh.write(f"{self.server} {path} {now:.6f}\n")
        await self.app(scope, receive, send)


class _Counting(BaseServer):
    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)
        app.add_middleware(CountingMiddleware, server=self.name)


class CountingAgent(_Counting, ToolAgent):
    pass


class CountingScripted(_Counting, ScriptedModel):
    pass


class CountingProxy(_Counting, OpenAIProxy):
    pass


class CountingEcho(_Counting, EchoEnv):
    pass
