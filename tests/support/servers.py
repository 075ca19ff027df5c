"""Test-only servers: a scripted model that fails on demand, an echo env that counts its calls.

Server processes import them as ``tests.support.servers`` (with the repository root on
``PYTHONPATH``); in-process tests serve the classes with ``rollgym.testing.serve_server``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.responses import Response

from rollgym.envs.echo.server import EchoEnv
from rollgym.models.scripted import ScriptedModel
from rollgym.server.base import ServerContext
from rollgym.server.endpoint import Call, JSONResponse
from rollgym.server.resources import Session, tool

from .waiting import wait_until

FAIL_MARKER = "FAIL-ME"
FAULT_MESSAGE = "injected fault: NaN in logprobs"
HOLD_LIMIT = 300.0
"""Seconds a held request waits at most (longer than any test that holds one)."""


class FaultyModel(ScriptedModel):
    """The scripted model, answering ``fail_status`` (500) on ``/v1/responses`` when the request
    contains ``fail_marker``, on every request while the file ``fail_while_exists`` exists
    (delete it to "fix" the model), or on every request for ``down_for`` seconds from the first
    one (an outage that ends by itself). Counts requests and the faults it answered; with
    ``request_log``, appends the rollout id of every request to that file. A request that
    arrives while the file ``hold_while_exists`` exists waits until it is deleted (the rollout
    stays in flight meanwhile), its rollout id appended to ``held_log`` first. With
    ``hold_each`` (in-process tests) every request waits in ``holding`` until ``release`` lets
    it on, one at a time."""

    class Options(ScriptedModel.Options):
        fail_marker: str | None = None
        fail_while_exists: str | None = None
        down_for: float | None = None
        request_log: str | None = None
        fail_status: int = 500
        hold_while_exists: str | None = None
        held_log: str | None = None
        hold_each: bool = False

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.requests = 0
        self.faults = 0
        self.first_request: float | None = None
        self.requested = asyncio.Event()  # set by the first request (in-process tests)
        self.rollout_ids: list[str | None] = []  # the x-rollgym-rollout of every request
        self.holding: list[asyncio.Event] = []  # one per request held (``hold_each``)

    def release(self, n: int = 1) -> None:
        """Let the first ``n`` requests still held (``hold_each``) on."""
        for gate in [g for g in self.holding if not g.is_set()][:n]:
            gate.set()

    def _failing(self, raw: bytes) -> bool:
        marker = self.options.fail_marker
        if marker and marker.encode() in raw:
            return True
        down_for, first = self.options.down_for, self.first_request
        if down_for is not None and first is not None and time.monotonic() - first < down_for:
            return True
        path = self.options.fail_while_exists
        return bool(path) and Path(path).exists()

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        self.requests += 1
        if self.first_request is None:
            self.first_request = time.monotonic()
        self.requested.set()
        self.rollout_ids.append(call.rollout)
        if self.options.request_log:
            # One line per model call with its rollout id: a count that survives this process,
            # to prove which rollouts a resumed run did (not) redo.
            _append_line(self.options.request_log, str(call.rollout))
        await self._hold(call)
        if not self._failing(orjson.dumps(params)):
            return await super().respond(params, call)
        self.faults += 1
        # Shaped like an OpenAI / vLLM error body, not a rollgym one: a real upstream does not
        # declare its 500 final, so the caller's retry policy decides.
        status = self.options.fail_status
        error = {"message": FAULT_MESSAGE, "type": "server_error", "code": status}
        return JSONResponse({"error": error}, status_code=status)

    async def _hold(self, call: Call) -> None:
        if self.options.hold_each:
            gate = asyncio.Event()
            self.holding.append(gate)
            await asyncio.wait_for(gate.wait(), HOLD_LIMIT)
            return
        # A file, not an event: the test and every replica's process see it.
        hold = self.options.hold_while_exists
        if not hold or not _exists(hold):
            return
        if self.options.held_log:
            _append_line(self.options.held_log, str(call.rollout))
        await wait_until(lambda: not _exists(hold), HOLD_LIMIT, f"{hold} deleted")


def _exists(path: str) -> bool:
    return Path(path).exists()


def _append_line(path: str, line: str) -> None:
    with open(path, "a") as fh:  # one small O_APPEND write: lines of concurrent calls never mix
        fh.write(line + "\n")


class CountingEcho(EchoEnv):
    """The echo environment, counting calls of each endpoint in ``calls``."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.calls: Counter[str] = Counter()

    async def seed_session(self, session: Session) -> None:
        self.calls["seed_session"] += 1

    @tool
    async def echo(self, session: Session, text: str) -> dict[str, Any]:
        """Return the text unchanged."""
        self.calls["echo"] += 1
        return await super().echo(session, text)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        self.calls["verify"] += 1
        return await super().verify(session, task, response)


@contextmanager
def refused_url(port: int = 0) -> Iterator[str]:
    """A loopback URL whose connections are refused while the block runs: its port is held
    bound here and never listened on, and Linux refuses a connection to such a port at once.

    Not a port bound and closed again: once closed, another process (a Ray worker, a second
    test run) may bind it and answer, or a client's own ephemeral port may be that very one (a
    TCP self-connect succeeds). Held without ``SO_REUSEADDR``, the port can be bound by no one
    else, not even as a client's local port.

    ``port``: the port of a server of this test that just stopped, held from now on. Its
    connections may linger in TIME_WAIT there, so this bind takes ``SO_REUSEADDR``: the OS
    still never hands the port out as a free one, but a bind naming it with ``SO_REUSEADDR``
    could share it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def port_of(url: str) -> int:
    """The port of an ``http://host:port`` URL."""
    port = urlsplit(url).port
    assert port is not None, url
    return port
