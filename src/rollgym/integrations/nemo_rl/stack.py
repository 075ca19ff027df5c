"""The servers ``RunHelper.start`` runs: a rollgym config's servers as processes of this one,
kept up by the watchdog, and a head server that tells collectors where they are.

Everything runs on an event loop of a private thread, so ``start``, ``poll`` and ``shutdown``
are plain calls that work with or without an event loop running in the caller's thread (NeMo
RL's Ray actor has one). The server processes are children of that thread: they get SIGTERM if
it ends (``rollgym.lifeline``), which is the process's end at the latest, and ``stop`` ends them
first, SIGTERM then SIGKILL, and waits for each (so no server outlives the run).

The head server answers the liveness routes (``/``, ``/health``, ``/healthz``, ``/livez``,
``/readyz``) and ``GET /rollgym_layout``: the config (credentials redacted) and the URLs of
the servers, which ``RolloutCollectionHelper.run_examples`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.collect.launchers import check_reachable
from rollgym.config import Config
from rollgym.errors import LaunchError, redact_url
from rollgym.http import HttpClient, Target
from rollgym.integrations.nemo_rl.plan import StackPlan
from rollgym.launch import Supervisor
from rollgym.launch.ports import bind_socket
from rollgym.launch.watch import RestartPolicy, Watchdog
from rollgym.version import __version__
from rollgym.wire import LAYOUT_PATH

T = TypeVar("T")
log = logging.getLogger("rollgym.nemo_gym")

LIVENESS_PATHS = ("/", "/health", "/healthz", "/livez", "/readyz")
STOP_TIMEOUT = 60.0
"""Seconds ``stop`` waits for everything (the servers' grace period is 10 s)."""
HEAD_TIMEOUT = 30.0
"""Seconds a collector waits for the head server's layout."""


@dataclass(frozen=True)
class Layout:
    """What the head server says (``RunningStack.layout``), as a collector reads it: the
    config, the servers' URLs, the policy model."""

    config: Config
    urls: dict[str, list[str]]
    policy_model: str | None
    concurrency: int | None
    connections: int | None

    @classmethod
    def fetch(cls, host: str, port: int) -> Layout:
        """Ask the head server at ``host:port`` (``LaunchError`` if nothing answers there)."""
        url = f"http://{host}:{port}{LAYOUT_PATH}"
        try:
            with urllib.request.urlopen(url, timeout=HEAD_TIMEOUT) as answer:
                data = json.loads(answer.read())
        except (OSError, ValueError) as exc:
            raise LaunchError(
                f"no rollgym head server at {host}:{port} ({exc}): is RunHelper started, and is "
                "this head_server_config its head_server?",
                server="head_server",
            ) from None
        return cls(
            Config.model_validate(data["config"]),
            {str(k): [str(u) for u in v] for k, v in data["urls"].items()},
            data.get("policy_model"),
            data.get("concurrency"),
            data.get("connections"),
        )

    def target(self, name: str) -> Target:
        """Server ``name`` as its callers reach it: its URLs, its config's retry policy."""
        return Target(name, tuple(u.rstrip("/") for u in self.urls[name]),
                      self.config.servers[name].retry)  # fmt: skip


class LoopThread:
    """An event loop on a daemon thread; ``run`` runs a coroutine there and waits for it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            # Interrupted (Ctrl-C during start) or timed out: the coroutine stops too, and
            # cleans up after itself (a launch stops what it started).
            future.cancel()
            raise

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class RunningStack:
    """The servers of ``plan`` and their head server (see the module docstring)."""

    def __init__(self, plan: StackPlan) -> None:
        self.plan = plan
        self.urls: dict[str, list[str]] = {}
        self.fatal: str | None = None
        self._thread: LoopThread | None = None
        self._supervisor: Supervisor | None = None
        self._head: uvicorn.Server | None = None
        self._head_task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start every server, wait until each answers (and NeMo RL's model URLs do), then
        serve the head server. On failure, what started is stopped and the error raised."""
        self._thread = LoopThread("rollgym-nemo-gym")
        try:
            self._thread.run(self._start())
        except BaseException:
            self.stop()
            raise

    async def _start(self) -> None:
        plan = self.plan
        # The head's port first: a port that is taken fails the start before any server runs.
        head_sock = _bind_head(plan.head_host, plan.head_port)
        try:
            supervisor = self._supervisor = Supervisor(
                plan.config, log_dir=plan.log_dir, startup_timeout=plan.startup_timeout
            )
            supervisor.watchdog = Watchdog(
                supervisor.group,
                plan.startup_timeout,
                RestartPolicy(max_restarts=plan.max_restarts),
            )
            self.urls = await supervisor.start()
            if plan.policy_urls and plan.model_wait > 0:
                await _wait_answering(list(plan.policy_urls), plan.model_wait)
            await self._serve_head(head_sock)
        except BaseException:
            head_sock.close()
            raise
        self._watch = asyncio.create_task(supervisor.watch(self._on_fatal))

    def _on_fatal(self, reason: str) -> None:
        log.error("rollgym servers cannot be kept up: %s", reason)
        self.fatal = reason

    def layout(self) -> dict[str, Any]:
        """What a collector needs: the config (redacted), the servers' URLs, the policy model."""
        plan = self.plan
        return {
            "rollgym": __version__,
            "config": plan.config.model_dump(mode="json"),
            "urls": {name: [redact_url(u) or u for u in us] for name, us in self.urls.items()},
            "policy_model": plan.policy_model,
            "concurrency": plan.concurrency,
            "connections": plan.connections,
        }

    async def _serve_head(self, sock: socket.socket) -> None:
        async def ok(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        async def layout(request: Request) -> JSONResponse:
            return JSONResponse(self.layout())

        routes = [Route(path, ok, methods=["GET"]) for path in LIVENESS_PATHS]
        routes.append(Route(LAYOUT_PATH, layout, methods=["GET"]))
        config = uvicorn.Config(
            Starlette(routes=routes), log_level="warning", lifespan="off", access_log=False
        )
        head = self._head = uvicorn.Server(config)
        task = self._head_task = asyncio.create_task(head.serve(sockets=[sock]))
        while not head.started:
            if task.done():
                task.result()
                raise LaunchError("the head server stopped while starting", server="head_server")
            await asyncio.sleep(0.01)

    def poll(self) -> None:
        """``RuntimeError`` if the servers are not all up and cannot be brought back: a server
        in a crash loop (the watchdog restarts one that dies), the head server or the
        supervising thread gone."""
        if self._thread is None or not self._thread.alive():
            raise RuntimeError("rollgym's servers are not running (never started, or stopped)")
        if self.fatal is not None:
            raise RuntimeError(f"rollgym server died: {self.fatal}")
        for what, task in (("head server", self._head_task), ("watchdog", self._watch)):
            if task is not None and task.done():
                raise RuntimeError(f"rollgym's {what} stopped unexpectedly: {_ended(task)}")

    def pids(self) -> dict[str, list[int]]:
        """The pids of each server's processes (one per replica), by server name."""
        found: dict[str, list[int]] = {}
        for server in self._supervisor.servers if self._supervisor is not None else []:
            if server.proc is not None:
                found.setdefault(server.name, []).append(server.proc.pid)
        return found

    def stop(self) -> None:
        """Stop everything ``start`` started, waiting for every process to end. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.run(self._stop(), STOP_TIMEOUT)
        finally:
            thread.stop()

    async def _stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._head is not None and self._head_task is not None:
            self._head.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._head_task, 10)
        if self._supervisor is not None:
            await self._supervisor.stop()


def _bind_head(host: str, port: int) -> socket.socket:
    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise LaunchError(
            f"head server: cannot listen on {host}:{port}: {exc.strerror or exc}",
            server="head_server",
        ) from None


async def _wait_answering(urls: list[str], seconds: float) -> None:
    """Wait until every URL answers HTTP at all (NeMo RL spins Gym up while vLLM is still
    loading); ``LaunchError`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    async with HttpClient(limit=64) as http:
        while True:
            left = deadline - time.monotonic()
            try:
                await check_reachable(
                    http, {"policy_base_url": urls}, max(1.0, min(10.0, left)), max(1.0, left)
                )
                return
            except LaunchError as err:
                if time.monotonic() + 1 >= deadline:
                    raise LaunchError(
                        f"NeMo RL's model URLs did not answer within {seconds:g}s "
                        f"(model_endpoint_readiness_timeout_seconds): {err.message}",
                        server="policy_base_url",
                    ) from None
            await asyncio.sleep(1.0)


def _ended(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return repr(exc) if exc is not None else "returned"
