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
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.agents.tool_agent import ToolAgent
from rollgym.envs.echo.server import EchoEnv
from rollgym.models.proxy import OpenAIProxy
from rollgym.models.scripted import ScriptedModel
from rollgym.server.base import BaseServer

STATS_PATH = "/_bench/stats"
EVENTS_ENV = "ROLLGYM_BENCH_EVENTS"


class RequestCounter:
    """Counts per path, shared by every route of one server."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.counts: Counter[str] = Counter()
        self.first_seen: dict[str, float] = {}
        self.events = os.environ.get(EVENTS_ENV)

    def hit(self, path: str) -> None:
        self.counts[path] += 1
        if path not in self.first_seen:
            now = self.first_seen[path] = time.time()
            if self.events:
                # Once per path and process: not worth a thread, and never on the hot path.
                with open(self.events, "a") as fh:
                    fh.write(f"{self.server} {path} {now:.6f}\n")

    async def stats(self, request: Request) -> Response:
        body = orjson.dumps({"counts": dict(self.counts), "first_seen": self.first_seen})
        return Response(body, media_type="application/json")


def _counted(endpoint: Any, counter: RequestCounter) -> Any:
    async def counted(request: Request) -> Response:
        counter.hit(request.url.path)
        return await endpoint(request)

    return counted


class _Counting(BaseServer):
    def routes(self) -> list[BaseRoute]:
        # Wrap each route's endpoint: rollgym sends hot POST routes straight to them, past any
        # app-level middleware.
        counter = RequestCounter(self.name)
        counted: list[BaseRoute] = [
            Route(r.path, _counted(r.endpoint, counter), methods=list(r.methods or ()))
            for r in super().routes()
            if isinstance(r, Route)
        ]
        return [*counted, Route(STATS_PATH, counter.stats, methods=["GET"])]


class CountingAgent(_Counting, ToolAgent):
    pass


class CountingScripted(_Counting, ScriptedModel):
    pass


class CountingProxy(_Counting, OpenAIProxy):
    pass


class CountingEcho(_Counting, EchoEnv):
    pass
