"""The launcher of a reverify run: the resources server and its peers, nothing else."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollgym.collect.peers import peers_of
from rollgym.config import Config
from rollgym.launch import Supervisor


class ResourcesOnly:
    """Starts only the resources server (and the peers its typed options name, e.g. a judge
    model) of a config. The collector needs a URL for the run's agent: it is given the
    resources server's, since here the resources server is what turns a row into a verified
    rollout; nothing else of the agent is called."""

    def __init__(self, config: Config, agent: str, resources: str, log_dir: Path, level: str):
        names = {resources} | peers_of(config, resources)
        servers = {n: s for n, s in config.servers.items() if n in names}
        sub = Config.model_validate({"servers": servers, "source": config.source})
        self.agent, self.resources = agent, resources
        self.supervisor = Supervisor(sub, log_dir=log_dir, log_level=level)

    async def start(self) -> dict[str, list[str]]:
        urls = await self.supervisor.start()
        return {**urls, self.agent: urls[self.resources]}

    async def stop(self) -> None:
        await self.supervisor.stop()

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        await self.supervisor.watch(on_fatal, pause)

    def report(self) -> dict[str, Any]:
        return self.supervisor.report()
