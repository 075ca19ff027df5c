"""``ServerHost``: the Ray actor that runs server replicas as processes on its node.

One host per node that has replicas, each running one ``ProcessGroup`` (the launcher the local
supervisor uses too), step by step so that the whole run is two-phase: ``bind`` on every node
(so every URL of the run is known before any server starts), then ``spawn`` with the full URL
map, then ``wait_healthy``. Children get SIGTERM when the host's process dies (Linux
parent-death signal), so a killed host or node leaves no orphan.

A sync actor on purpose: Ray runs its methods on the worker's main thread, and the
parent-death signal is tied to the thread that forked the child. The group's async steps run in
a short ``asyncio.run`` on that same thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray

from rollgym.launch.group import ProcessGroup, ServerSpec

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServerHost:
    """Runs the replicas placed on this node. ``config`` is ``Config.model_dump(mode="json")``."""

    def __init__(
        self,
        config: dict[str, Any],
        log_dir: str | None,
        log_level: str,
        *,
        single_node: bool = False,
    ) -> None:
        self.config = config
        # On a one-node cluster every caller is on this machine: stay on loopback rather than
        # expose unauthenticated tool and verify servers on the node's network address.
        self.single_node = single_node
        self.ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.group = ProcessGroup(
            config,
            log_dir=Path(log_dir) if log_dir else None,
            log_level=log_level,
            node=self.ip,
        )

    def node(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": self.ip}

    def bind(self, name: str, replica: int) -> str:
        """Listen for replica ``replica`` of server ``name``; return its URL."""
        cfg = self.config["servers"][name]
        host = cfg.get("host") or "127.0.0.1"
        # A loopback address cannot be reached from the other nodes: listen on the node's own.
        bind_host = self.ip if host in _LOOPBACK and not self.single_node else host
        port = (cfg["port"] + replica) if cfg.get("port") else 0
        spec = ServerSpec(
            name, replica, bind_host, port, url_host=self.ip, log_name=f"{name}.{replica}.log"
        )
        return self.group.bind(spec).url

    def spawn(self, urls: dict[str, list[str]]) -> dict[str, int]:
        """Start every bound replica; return ``name.replica`` -> pid."""
        return self.group.spawn(urls)

    def wait_healthy(self, timeout: float, warmup_timeout: float | None = None) -> None:
        """Return once every replica answers ``/health``; raise ``LaunchError`` otherwise
        (``warmup_timeout``: for a replica warming up, default the group's)."""
        asyncio.run(self.group.wait_healthy(timeout, warmup_timeout))

    def poll(self) -> dict[str, int]:
        """``name.replica`` -> exit code of every replica whose process has ended."""
        return self.group.poll()

    def kill(self, name: str, replica: int) -> None:
        """SIGKILL one replica's process (fault tests and drills)."""
        self.group.find(name, replica).kill()

    def stop(self) -> None:
        """SIGTERM every replica, then SIGKILL those still running after the grace period."""
        asyncio.run(self.group.stop())


ServerHostActor = ray.remote(max_restarts=0)(ServerHost)
