"""The pieces of the OpenEnv tests: OpenEnv's example echo environment (``openenv init``'s) and
variants of it that crash or hang, the scripted model and ``openenv_agent`` on real sockets, and
a TCP relay that drops a WebSocket at a chosen answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import aiohttp.web
import orjson

from rollgym.http import Target
from rollgym.launch.ports import bind_socket
from rollgym.openenv.agent import OpenEnvAgent
from rollgym.testing import serve_asgi, serve_server
from tests.support.stack import fast_policy

TIMEOUT = aiohttp.ClientTimeout(total=20)
RELEASE = threading.Event()
"""Set at teardown: a hung step (a thread of openenv-core's executor) returns."""


def echo_classes() -> tuple[Any, Any, Any]:
    """(environment, action, observation) classes of ``openenv init``'s echo environment."""
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment

    return EchoEnvironment, EchoAction, EchoObservation


def faulty_echo() -> Any:
    """The echo environment, except that the message ``boom`` raises, ``hang`` blocks,
    ``count`` is rewarded with the number of steps of its own session so far, and ``huge``
    with 1.7e308."""
    env_cls, _, _ = echo_classes()

    class FaultyEcho(env_cls):  # type: ignore[misc,valid-type]
        def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
            if action.message == "boom":
                raise RuntimeError("the echo environment broke on purpose")
            if action.message == "hang":
                RELEASE.wait(30)  # bounded: a test's teardown sets it
            result = super().step(action)
            if action.message == "count":
                result.reward = float(self._state.step_count)
            if action.message == "huge":  # finite; two of them sum to inf
                result.reward = 1.7e308
            return result

    return FaultyEcho


def echo_app(max_concurrent_envs: int = 4, env: Any = None) -> Any:
    """openenv-core's app for the echo environment (``env``: another environment class)."""
    from openenv.core.env_server.http_server import create_app

    env_cls, action, observation = echo_classes()
    return create_app(
        env or env_cls, action, observation, env_name="echo_env",
        max_concurrent_envs=max_concurrent_envs,
    )  # fmt: skip


def echo_rewards(messages: list[str]) -> list[float]:
    """The rewards the echo environment itself gives for ``messages``, played in-process."""
    env_cls, action, _ = echo_classes()
    env = env_cls()
    env.reset()
    return [env.step(action(message=m)).reward for m in messages]


def script_row(turns: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": "Echo what you are told.",
            "metadata": {"rollgym_script": orjson.dumps(turns).decode()},
        },
        **fields,
    }


def acts(*messages: str, end: str | None = "done") -> list[dict[str, Any]]:
    """A script that sends each message as one ``act`` call, then says ``end``."""
    turns: list[dict[str, Any]] = [{"call": "act", "arguments": {"message": m}} for m in messages]
    return turns + ([{"say": end}] if end is not None else [])


@dataclass
class Stack:
    agent_url: str
    env_url: str

    async def run(self, row: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.post(self.agent_url + "/run", data=orjson.dumps(row)) as resp,
        ):
            return resp.status, orjson.loads(await resp.read())


@asynccontextmanager
async def agent_stack(
    app: Any = None,
    *,
    env_url: str | None = None,
    retry: dict[str, Any] | None = None,
    replicas: tuple[str, ...] = (),
    **options: Any,
) -> AsyncIterator[Stack]:
    """The scripted model and ``openenv_agent`` playing ``app`` (served here on a real socket),
    or the OpenEnv server at ``env_url`` (a relay in front of one); ``replicas``: more URLs of
    the same server (other OpenEnv servers)."""
    async with AsyncExitStack() as stack:
        model_url, _ = await stack.enter_async_context(serve_server("scripted", name="model"))
        url = env_url or await stack.enter_async_context(serve_asgi(app))
        policy = fast_policy("resources", **(retry or {}))
        peers = {
            "model": Target.single("model", model_url, fast_policy("model")),
            "echo": Target("echo", (url, *replicas), policy),
        }
        opts = {"model": "model", "resources": "echo", "max_steps": 5, **options}
        agent_url, _ = await stack.enter_async_context(
            serve_server(OpenEnvAgent, name="agent", options=opts, peers=peers)
        )
        yield Stack(agent_url, url)


@dataclass
class Relay:
    """A TCP relay to ``upstream`` that cuts connection number ``drop_connection`` (from 0) when
    the server's answer number ``drop_answer`` (from 1; an observation message) reaches it,
    without passing that answer on."""

    upstream: tuple[str, int]
    drop_connection: int
    drop_answer: int
    connections: int = 0
    dropped: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cut: Callable[[bytes], bool],
        peers: tuple[asyncio.StreamWriter, ...],
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                if cut(chunk):
                    self.dropped += 1
                    break
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for w in peers:
                w.close()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        answers = 0

        def cut(chunk: bytes) -> bool:
            nonlocal answers
            if b'"type":"observation"' in chunk or b'"type": "observation"' in chunk:
                answers += 1
                return index == self.drop_connection and answers == self.drop_answer
            return False

        both = (c_writer, s_writer)
        await asyncio.gather(
            self._pipe(c_reader, s_writer, lambda _: False, both),
            self._pipe(s_reader, c_writer, cut, both),
        )


@asynccontextmanager
async def relay(upstream_url: str, drop_connection: int, drop_answer: int) -> AsyncIterator[Any]:
    host, port = upstream_url.removeprefix("http://").split(":")
    r = Relay((host, int(port)), drop_connection, drop_answer)
    sock = bind_socket()
    server = await asyncio.start_server(r._serve, sock=sock)
    try:
        yield r, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.close()
        async with asyncio.timeout(5):
            await server.wait_closed()


@asynccontextmanager
async def serve_aiohttp(app: aiohttp.web.Application) -> AsyncIterator[str]:
    """An aiohttp application (a misbehaving OpenEnv server) on 127.0.0.1; yields its URL."""
    runner = aiohttp.web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = aiohttp.web.SockSite(runner, bind_socket("127.0.0.1", 0))
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._sock.getsockname()[1]}"
    finally:
        await runner.cleanup()
