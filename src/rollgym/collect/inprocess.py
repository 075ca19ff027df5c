"""The agent inside the collector's process (``collect.agent_in_process``): one hop fewer.

By default every rollout is a ``POST /run`` to an agent process. With this option the run's
agents are built in the collector's process instead, and ``/run`` is served to the collector
through ``rollgym.http.inprocess`` (no socket, no HTTP parsing, no process). Everything the
collector sees is unchanged: the same rollout records, error bodies, retries, circuit holds and
deadlines, because it still calls the agent's app exactly as a server would serve it. The model
and environment servers are reached over HTTP as before.

The price: the agent's code runs on the collector's event loop. An agent that blocks the loop
(CPU-heavy work in ``run``) stalls collection, and one that crashes the process ends the run
(``--resume`` finishes it). A rollout's deadline cancels the agent's work in the collector's
own task and waits for its clean-up (the calls it cancels), where over a socket the collector
would give up at once and leave the clean-up to the agent: a rollout can end that much after
its deadline. Not for ``--ray``, where workers already sit beside the agents.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rollgym.http.default import default_transport
from rollgym.http.inprocess import InProcessTransport, inprocess_url
from rollgym.server.app import build_app
from rollgym.server.base import BaseServer, ServerContext, resolve_impl

if TYPE_CHECKING:
    from rollgym.collect.launchers import Launcher
    from rollgym.config import Config

log = logging.getLogger("rollgym.collect")


def in_process_agents(config: Config) -> list[str]:
    """The agents a run would launch (every agent server without a ``url:``)."""
    return [n for n, s in config.servers.items() if s.kind == "agent" and not s.url]


class InProcessAgents:
    """A launcher: ``inner`` brings up every server but ``names``, which are then built here
    and served to the collector by ``transport``."""

    def __init__(self, inner: Launcher, config: Config, names: Sequence[str]) -> None:
        self.inner = inner
        self.config = config
        self.names = list(names)
        self.servers: list[BaseServer] = []
        self.transport = InProcessTransport({}, default_transport())

    async def start(self) -> dict[str, list[str]]:
        urls = await self.inner.start()
        # An agent the inner launcher found running (``collect --servers agent=URL``) is used
        # there: a URL given by hand says where that agent is.
        self.names = [name for name in self.names if name not in urls]
        every = {**urls, **{name: [inprocess_url(name)] for name in self.names}}
        for name in self.names:
            cfg = self.config.servers[name]
            klass = resolve_impl(
                cfg.impl, cfg.kind, config_dir=self.config.base_dir(),
                where=f"{self.config.source or 'config'}: servers.{name}.impl",
            )  # fmt: skip
            server = klass(ServerContext.from_run(name, self.config, every))
            self.servers.append(server)  # before startup: a failed one is shut down too
            await server.startup()
            self.transport.apps[name] = build_app(server)
        return every

    async def stop(self) -> None:
        try:
            for server in self.servers:
                try:
                    await server.shutdown()
                except Exception:  # one agent's failed shutdown must not keep the others up
                    log.exception("in-process agent %s: shutdown failed", server.name)
            self.servers.clear()
            await self.transport.close()
        finally:
            await self.inner.stop()

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        await self.inner.watch(on_fatal, pause)

    def report(self) -> dict[str, Any]:
        return {**self.inner.report(), "agents_in_process": self.names}
