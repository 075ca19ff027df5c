"""``ServerHost``: the Ray actor that runs server replicas as processes on its node.

One host per node that has replicas. It starts each replica exactly as the local supervisor
does, ``python -m rollgym.launch.worker`` with a listening socket and a JSON spec in
``ROLLGYM_WORKER``, in two steps: ``bind`` (so every URL of the run is known before any server
starts) then ``spawn`` (every server told where the others are). Children get SIGTERM when the
host's process dies (Linux parent-death signal), so a killed host or node leaves no orphan.

A sync actor on purpose: Ray runs its methods on the worker's main thread, and the
parent-death signal is tied to the thread that forked the child.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import ray

from rollgym.errors import LaunchError
from rollgym.launch.process import ServerProcess

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_WILDCARD = ("0.0.0.0", "::", "")


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
        self.log_dir = Path(log_dir) if log_dir else None
        self.log_level = log_level
        self.ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.replicas: dict[tuple[str, int], ServerProcess] = {}

    def node(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": self.ip}

    def bind(self, name: str, replica: int) -> str:
        """Listen for replica ``replica`` of server ``name``; return its URL."""
        cfg = self.config["servers"][name]
        host = cfg.get("host") or "127.0.0.1"
        # A loopback address cannot be reached from the other nodes: listen on the node's own.
        bind_host = self.ip if host in _LOOPBACK and not self.single_node else host
        port = (cfg["port"] + replica) if cfg.get("port") else 0
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            sock.close()
            raise LaunchError(
                f"server {name}: cannot listen on {bind_host}:{port} on node {self.ip}: "
                f"{exc.strerror}",
                server=name,
            ) from None
        sock.listen(4096)
        bound = sock.getsockname()[1]
        url_host = self.ip if bind_host in _WILDCARD else bind_host
        url = f"http://{url_host}:{bound}"
        self.replicas[(name, replica)] = ServerProcess(name, replica, url, sock)
        return url

    def spawn(self, urls: dict[str, list[str]]) -> dict[str, int]:
        """Start every bound replica; return ``name.replica`` -> pid."""
        pids: dict[str, int] = {}
        for rep in self.replicas.values():
            if rep.proc is None:
                pids[f"{rep.name}.{rep.replica}"] = self._spawn(rep, urls).pid
        return pids

    def _spawn(self, rep: ServerProcess, urls: dict[str, list[str]]) -> subprocess.Popen[bytes]:
        return rep.spawn(
            self.config,
            urls,
            log_dir=self.log_dir,
            log_name=f"{rep.name}.{rep.replica}.log",
            log_level=self.log_level,
        )

    def wait_healthy(self, timeout: float) -> None:
        """Return once every replica answers ``/health``; raise ``LaunchError`` otherwise."""
        deadline = time.monotonic() + timeout
        pending = [r for r in self.replicas.values() if r.proc is not None]
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while pending:
            for rep in list(pending):
                assert rep.proc is not None
                code = rep.proc.poll()
                if code is not None:
                    raise LaunchError(
                        f"server {rep.name} (replica {rep.replica} on {self.ip}) exited with "
                        f"code {code} while starting" + rep.log_tail(),
                        server=rep.name,
                    )
                with (
                    contextlib.suppress(OSError),
                    opener.open(rep.url + "/health", timeout=1.0) as resp,
                ):
                    if resp.status == 200:
                        pending.remove(rep)
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{r.name}.{r.replica}" for r in pending)
                raise LaunchError(f"servers not healthy after {timeout:g}s on {self.ip}: {names}")
            time.sleep(0.05)

    def poll(self) -> dict[str, int]:
        """``name.replica`` -> exit code of every replica whose process has ended."""
        return {
            f"{r.name}.{r.replica}": code
            for r in self.replicas.values()
            if r.proc is not None and (code := r.proc.poll()) is not None
        }

    def kill(self, name: str, replica: int) -> None:
        """SIGKILL one replica's process (fault tests and drills)."""
        rep = self.replicas[(name, replica)]
        if rep.proc is not None and rep.proc.poll() is None:
            rep.proc.kill()
            rep.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every replica, wait up to ``timeout``, then SIGKILL what is left."""
        for rep in self.replicas.values():
            if rep.proc is not None and rep.proc.poll() is None:
                rep.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for rep in self.replicas.values():
            if rep.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rep.proc.wait(max(0.0, deadline - time.monotonic()))
                if rep.proc.poll() is None:
                    rep.proc.kill()
                    rep.proc.wait()
            rep.close()


ServerHostActor = ray.remote(max_restarts=0)(ServerHost)
