"""``run_on_ray``: ``rollgym run --ray``, the one run orchestration with a Ray launcher (servers
as processes on the cluster's nodes) and the Ray dispatcher (collect worker actors)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from rollgym.collect import RolloutPolicy, RunOutcome, run_collection
from rollgym.config import CollectConfig, Config
from rollgym.ray.dispatch import RayDispatcher
from rollgym.ray.placement import connect
from rollgym.ray.servers import RayServers


class RayLauncher:
    """Joins the Ray cluster at ``address`` (None: ``RAY_ADDRESS``, else a new local one; an
    already initialised Ray is used as it is) and starts ``servers`` on it; ``stop`` stops them
    and leaves a Ray that it started."""

    def __init__(self, servers: RayServers, address: str | None = None) -> None:
        self.servers = servers
        self.address = address
        self._owns_ray = False

    async def start(self) -> dict[str, list[str]]:
        self._owns_ray = connect(self.address)
        return await self.servers.start()

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        """Lost replicas are the dispatcher's business on a cluster (it takes them out of
        rotation); they are not restarted."""

    def report(self) -> dict[str, Any]:
        return {}

    async def stop(self) -> None:
        try:
            if ray.is_initialized():
                await self.servers.stop()
        finally:
            if self._owns_ray:
                self._owns_ray = False
                ray.shutdown()


async def run_on_ray(
    config: Config,
    collect: CollectConfig,
    input_path: Path,
    out_dir: Path,
    *,
    resume: bool = False,
    agent: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    log_level: str = "WARNING",
    startup_timeout: float = 120.0,
) -> RunOutcome:
    """Validate the input, start the config's servers on the Ray cluster at ``address``, collect
    with ``workers`` actors (default: one per node) into ``out_dir``, stop the servers."""
    servers = RayServers(
        config, log_dir=out_dir / "logs", log_level=log_level, startup_timeout=startup_timeout
    )
    dispatcher = RayDispatcher(
        RolloutPolicy.from_collect(collect), collect.concurrency, servers=servers, workers=workers
    )
    return await run_collection(
        config, collect, input_path, out_dir, RayLauncher(servers, address),
        dispatcher=dispatcher, resume=resume, agent=agent, progress=progress,
    )  # fmt: skip
