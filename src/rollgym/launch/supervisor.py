"""The local launcher behind ``rollgym serve`` and ``rollgym run``: a config's servers as
processes on this machine, one ``ProcessGroup``.

Children get SIGTERM if this process dies (Linux parent-death signal, set by each worker), so
no orphan outlives its run.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from rollgym.config import Config
from rollgym.launch.group import ProcessGroup, ServerSpec
from rollgym.launch.process import STARTUP_TIMEOUT, ServerProcess
from rollgym.launch.timeouts import WARMUP_TIMEOUT
from rollgym.launch.watch import Watchdog
from rollgym.server.base import check_servers


class Supervisor:
    """Start the servers of ``config`` (all but those given by ``url`` and those in ``skip``,
    which run elsewhere: in the collector's process), and stop them. ``checked``: the caller
    ran ``check_servers(config)`` already (a run's pre-flight, ``rollgym.collect.launchers``);
    otherwise ``start`` runs it first."""

    def __init__(
        self,
        config: Config,
        *,
        log_dir: Path | None = None,
        log_level: str = "WARNING",
        startup_timeout: float = STARTUP_TIMEOUT,
        warmup_timeout: float = WARMUP_TIMEOUT,
        skip: Collection[str] = (),
        checked: bool = False,
    ) -> None:
        self.config = config
        self.checked = checked
        self.skip = frozenset(skip)
        self.startup_timeout = startup_timeout
        self.group = ProcessGroup(
            config.model_dump(mode="json", context={"keep_secrets": True}),
            log_dir=log_dir,
            log_level=log_level,
            warmup_timeout=warmup_timeout,
        )
        self.urls: dict[str, list[str]] = {}
        self.watchdog = Watchdog(self.group, startup_timeout)

    @property
    def servers(self) -> list[ServerProcess]:
        """Every replica bound so far, started or not."""
        return self.group.servers

    async def start(self) -> dict[str, list[str]]:
        """Start every server and wait until each answers ``/health``; return name -> URLs.
        On failure everything started is stopped and ``LaunchError`` (or ``ConfigError``, before
        anything starts) propagates."""
        if not self.checked:
            check_servers(self.config)  # an unknown impl, a mistyped option, a missing peer
        external: dict[str, list[str]] = {}
        specs: list[ServerSpec] = []
        for name, cfg in self.config.servers.items():
            if name in self.skip:
                continue
            if cfg.url:
                external[name] = [cfg.url.rstrip("/")]
                continue
            for replica in range(cfg.replicas):
                suffix = f".{replica}" if cfg.replicas > 1 else ""
                port = (cfg.port + replica) if cfg.port else 0
                specs.append(
                    ServerSpec(name, replica, cfg.host, port, log_name=f"{name}{suffix}.log")
                )
        self.urls = await self.group.start(specs, external, self.startup_timeout)
        return self.urls

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        """Until cancelled: restart a server whose process dies, with dispatch paused
        meanwhile; ``on_fatal(reason)`` for a crash loop (see ``rollgym.launch.watch``)."""
        await self.watchdog.run(on_fatal, pause)

    def report(self) -> dict[str, Any]:
        """Restarts per replica, for ``metrics.json``."""
        return {"restarts": self.watchdog.report()}

    async def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after a grace period). Idempotent, and safe
        after a failed start."""
        await self.group.stop()

    def pids(self) -> list[int]:
        return self.group.pids()

    def kill(self, name: str, replica: int = 0) -> None:
        """SIGKILL one server process (fault tests)."""
        self.group.find(name, replica).kill()

    async def restart(self, name: str, replica: int = 0) -> None:
        """Start a killed server again on the same port (fault tests: a server comes back)."""
        await self.group.restart(name, replica, self.startup_timeout)
