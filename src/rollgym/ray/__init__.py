"""rollgym on a Ray cluster. Importing this package imports Ray; nothing else in rollgym does.

- ``RayServers``: a config's servers as processes on the cluster's nodes (``replicas`` each,
  spread round-robin, one ``ServerHost`` actor per node starting them).
- ``RayDispatcher``: the collector's dispatch spread over ``CollectWorker`` actors (each runs
  the one rollout core); the driver keeps the one recorder and ledger.
- ``RayLauncher``, ``run_on_ray``: the one run orchestration with both, what
  ``rollgym run --ray`` does.

The trainer-facing API (``rollgym.trainer``) needs no Ray at all; it works inside Ray actors.
"""

from rollgym.ray.dispatch import RayDispatcher
from rollgym.ray.launcher import RayLauncher
from rollgym.ray.placement import NodeInfo, alive_nodes, connect
from rollgym.ray.run import run_on_ray
from rollgym.ray.servers import RayServers, Replica

__all__ = [
    "NodeInfo",
    "RayDispatcher",
    "RayLauncher",
    "RayServers",
    "Replica",
    "alive_nodes",
    "connect",
    "run_on_ray",
]
