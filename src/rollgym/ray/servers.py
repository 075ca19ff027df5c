"""``RayServers``: a config's servers as processes spread over the nodes of a Ray cluster.

Each server's ``replicas`` are laid out round-robin over the live nodes (so replicas of one
server land on distinct nodes first); every node that gets a replica gets one ``ServerHost``
actor, which binds the replicas' sockets, starts their processes and watches them. Start-up is
two-phase like the local supervisor's: bind everywhere, then start everywhere with the full URL
map, so each server knows every replica of the others. Servers with ``url:`` are not launched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from rollgym.config import Config
from rollgym.errors import LaunchError
from rollgym.launch.process import STOP_GRACE
from rollgym.launch.timeouts import WARMUP_TIMEOUT
from rollgym.ray.host import ServerHostActor
from rollgym.ray.placement import NodeInfo, alive_nodes, get, on_node, spread
from rollgym.server.base import check_servers

log = logging.getLogger("rollgym.ray")

STARTUP_TIMEOUT = 60.0
"""Seconds for every replica to answer ``/health``: placing the host actors included."""
_HOST_SLACK_S = 10.0  # beyond a host's own deadlines, so its plain error arrives first


@dataclass
class Replica:
    """One started replica: where it runs and whether it is still alive."""

    name: str
    replica: int
    url: str
    node: NodeInfo
    pid: int | None = None
    exit_code: int | None = None
    alive: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "server": self.name,
            "replica": self.replica,
            "url": self.url,
            "node_id": self.node.node_id,
            "node_ip": self.node.ip,
            "pid": self.pid,
            **({} if self.alive else {"exit_code": self.exit_code}),
        }


class RayServers:
    """Start, watch and stop the servers of ``config`` on the current Ray cluster.
    ``checked``: the caller ran ``check_servers(config)`` already (a run's pre-flight,
    ``rollgym.collect.launchers``); otherwise ``start`` runs it first."""

    def __init__(
        self,
        config: Config,
        *,
        log_dir: Path | None = None,
        log_level: str = "WARNING",
        nodes: list[NodeInfo] | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        warmup_timeout: float = WARMUP_TIMEOUT,
        checked: bool = False,
    ) -> None:
        self.config = config
        self.checked = checked
        self.startup_timeout = startup_timeout
        self.warmup_timeout = warmup_timeout
        self.log_dir = log_dir
        self.log_level = log_level
        self._nodes = nodes
        self.replicas: list[Replica] = []
        self.urls: dict[str, list[str]] = {}
        self._hosts: dict[str, Any] = {}  # node id -> ServerHost actor handle

    async def __aenter__(self) -> RayServers:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _layout(self, nodes: list[NodeInfo]) -> list[tuple[tuple[str, int], NodeInfo]]:
        wanted: list[tuple[str, int]] = []
        for name, cfg in self.config.servers.items():
            if cfg.url:
                self.urls[name] = [cfg.url.rstrip("/")]
            else:
                wanted.extend((name, r) for r in range(cfg.replicas))
        return spread(wanted, nodes)

    async def start(self) -> dict[str, list[str]]:
        """Start every replica and wait until each answers ``/health``, all within the
        startup timeout; return name -> URLs. On failure everything started is stopped and
        ``LaunchError`` (or ``ConfigError``, before anything starts) propagates."""
        if not self.checked:
            check_servers(self.config)  # an unknown impl, a mistyped option, a missing peer
        try:
            await self._start(time.monotonic())
        except BaseException:
            await self.stop()
            raise
        return self.urls

    async def _start(self, started: float) -> None:
        deadline = started + self.startup_timeout
        # A server that says it is warming up (a scoring pool) may take the warm-up bound.
        warm_deadline = started + max(self.startup_timeout, self.warmup_timeout)
        nodes = self._nodes or alive_nodes()
        layout = self._layout(nodes)
        config_json = self.config.model_dump(mode="json", context={"keep_secrets": True})
        # absolute(), not resolve(): a link there is refused, never followed (launch.process)
        log_dir = str(self.log_dir.absolute()) if self.log_dir else None
        for _, node in layout:
            if node.node_id not in self._hosts:
                self._hosts[node.node_id] = ServerHostActor.options(
                    num_cpus=0,
                    scheduling_strategy=on_node(node, soft=False),
                ).remote(config_json, log_dir, self.log_level, single_node=len(nodes) == 1)
        binds = [self._hosts[node.node_id].bind.remote(name, r) for (name, r), node in layout]
        urls = await self._step("bind", binds, deadline)
        for ((name, r), node), url in zip(layout, urls, strict=True):
            self.replicas.append(Replica(name, r, url, node))
            self.urls.setdefault(name, []).append(url)
        pids: list[dict[str, int]] = await self._step(
            "spawn", [host.spawn.remote(self.urls) for host in self._hosts.values()], deadline
        )
        by_key = {k: v for part in pids for k, v in part.items()}
        for rep in self.replicas:
            rep.pid = by_key.get(f"{rep.name}.{rep.replica}")
        # Each host waits until the common deadline and names its own late or dead server;
        # the slack lets that error, not a bare timeout here, be the one that surfaces.
        remaining = max(0.0, deadline - time.monotonic())
        warm_remaining = max(0.0, warm_deadline - time.monotonic())
        await self._step(
            "wait_healthy",
            [h.wait_healthy.remote(remaining, warm_remaining) for h in self._hosts.values()],
            warm_deadline + _HOST_SLACK_S,
        )
        log.info(
            "started %d replicas on %d nodes: %s",
            len(self.replicas), len(self._hosts),
            ", ".join(f"{r.name}.{r.replica}@{r.url}" for r in self.replicas),
        )  # fmt: skip

    async def _step(self, step: str, refs: list[Any], deadline: float) -> Any:
        """Await one start-up step on the hosts by ``deadline``; Ray's failures (a host that
        died, a step that never finished) become ``LaunchError`` saying which step."""
        try:
            return await get(refs, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise LaunchError(
                f"servers on the Ray cluster: {step} did not finish within the startup timeout "
                f"({self.startup_timeout:g}s) on {len(self._hosts)} node(s)"
            ) from None
        except RayActorError as exc:
            raise LaunchError(
                f"servers on the Ray cluster: a server host died during {step}: {exc}"
            ) from None

    def replica(self, name: str, index: int = 0) -> Replica:
        for rep in self.replicas:
            if rep.name == name and rep.replica == index:
                return rep
        raise KeyError(f"no replica {index} of server {name!r}")

    async def poll(self, timeout: float = 10.0) -> list[Replica]:
        """Find replicas that died since the last poll (their process ended, or their host's
        node is gone); mark them dead and return them."""
        lost: list[Replica] = []
        for node_id, host in self._hosts.items():
            on_node_ = [r for r in self.replicas if r.node.node_id == node_id and r.alive]
            if not on_node_:
                continue
            try:
                ended: dict[str, int] = await get(host.poll.remote(), timeout)
            except (RayActorError, TimeoutError):
                ended = {f"{r.name}.{r.replica}": -1 for r in on_node_}  # host or node gone
            for rep in on_node_:
                code = ended.get(f"{rep.name}.{rep.replica}")
                if code is not None:
                    rep.alive, rep.exit_code = False, code
                    lost.append(rep)
        for rep in lost:
            log.warning(
                "server %s replica %d at %s (node %s) is gone (exit code %s)",
                rep.name, rep.replica, rep.url, rep.node.ip, rep.exit_code,
            )  # fmt: skip
        return lost

    async def kill(self, name: str, replica: int = 0) -> None:
        """SIGKILL one replica's process (fault tests and drills)."""
        rep = self.replica(name, replica)
        await get(self._hosts[rep.node.node_id].kill.remote(name, replica), 30)

    async def stop(self) -> None:
        """Stop every replica (SIGTERM, then SIGKILL after a grace period) and their hosts.
        Idempotent, and safe after a failed start."""
        hosts, self._hosts = list(self._hosts.values()), {}
        if not hosts:
            return
        results = await asyncio.gather(
            *(get(h.stop.remote(), STOP_GRACE + _HOST_SLACK_S) for h in hosts),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, Exception):
                log.warning("stopping servers: %s", result)  # the host is killed below anyway
        for host in hosts:
            with contextlib.suppress(Exception):
                ray.kill(host)

    def describe(self) -> list[dict[str, Any]]:
        return [r.describe() for r in self.replicas]
