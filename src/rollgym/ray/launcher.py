"""``rollgym run --ray``'s launcher: the config's servers as processes on the cluster's nodes
(``RayServers``), answering ``rollgym.collect.launchers.Launcher`` like every other launcher.
The pre-flight of the servers (``check_servers``) runs where it is built, before anything is
written or started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from rollgym.config import Config
from rollgym.ray.placement import connect
from rollgym.ray.servers import RayServers
from rollgym.server.base import check_servers

__all__ = ["RayLauncher", "ray_launcher"]


def ray_launcher(
    config: Config,
    *,
    address: str | None,
    log_dir: Path | None,
    log_level: str,
    startup_timeout: float,
) -> RayLauncher:
    """``rollgym run --ray``'s launcher: the config's servers, checked first, on the Ray
    cluster at ``address`` (joined only when the run starts)."""
    check_servers(config)
    servers = RayServers(
        config, log_dir=log_dir, log_level=log_level, startup_timeout=startup_timeout,
        checked=True,
    )  # fmt: skip
    return RayLauncher(servers, address)


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
