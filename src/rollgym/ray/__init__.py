"""rollgym on a Ray cluster. Importing this package imports Ray; nothing else in rollgym does.

- ``RayServers``: a config's servers as processes on the cluster's nodes (``replicas`` each,
  spread round-robin, one ``ServerHost`` actor per node starting them).
- ``RayCollector``: the collector with dispatch spread over ``CollectWorker`` actors; the driver
  keeps the one ledger.
- ``run_on_ray``: both together, what ``rollgym run --ray`` does.

The trainer-facing API (``rollgym.trainer``) needs no Ray at all; it works inside Ray actors.
"""

from rollgym.ray.collector import RayCollector
from rollgym.ray.placement import NodeInfo, alive_nodes, connect
from rollgym.ray.run import run_on_ray
from rollgym.ray.servers import RayServers, Replica

__all__ = [
    "NodeInfo",
    "RayCollector",
    "RayServers",
    "Replica",
    "alive_nodes",
    "connect",
    "run_on_ray",
]
