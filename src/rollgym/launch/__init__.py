"""Start a config's servers as real processes, wait for health, stop them cleanly.

One path for every launcher: ``ports`` binds the sockets, ``process`` spawns and stops one
server, ``health`` waits for ``/health``, ``group`` does all of it for a set of replicas;
``Supervisor`` runs one group locally and each Ray ``ServerHost`` runs one on its node.
"""

from rollgym.launch.group import ProcessGroup, ServerSpec
from rollgym.launch.health import wait_healthy
from rollgym.launch.ports import bind_socket
from rollgym.launch.process import ServerProcess
from rollgym.launch.supervisor import Supervisor

__all__ = [
    "ProcessGroup",
    "ServerProcess",
    "ServerSpec",
    "Supervisor",
    "bind_socket",
    "wait_healthy",
]
