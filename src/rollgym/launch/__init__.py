"""Start a config's servers as real processes, wait for health, stop them cleanly.

One path for every launcher: ``ports`` binds the sockets, ``process`` spawns and stops one
server, ``health`` waits for ``/health``, ``group`` does all of it for a set of replicas;
``Supervisor`` runs one group locally and each Ray ``ServerHost`` runs one on its node.

The names below are imported on first use: a server process runs ``rollgym.launch.worker``
and must not pay for the supervisor's HTTP client at every start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollgym.launch.group import ProcessGroup, ServerSpec
    from rollgym.launch.health import wait_healthy
    from rollgym.launch.ports import bind_socket
    from rollgym.launch.process import ServerProcess
    from rollgym.launch.supervisor import Supervisor

_HOMES = {
    "ProcessGroup": "group",
    "ServerSpec": "group",
    "wait_healthy": "health",
    "bind_socket": "ports",
    "ServerProcess": "process",
    "Supervisor": "supervisor",
}

__all__ = [
    "ProcessGroup",
    "ServerProcess",
    "ServerSpec",
    "Supervisor",
    "bind_socket",
    "wait_healthy",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rollgym.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rollgym.launch.{home}"), name)
