"""Where things run: the cluster's live nodes, and a round-robin spread of work over them.

Server replicas and collect workers are pinned to nodes round-robin (a server's replicas on
distinct nodes first), with Ray's node-affinity strategy: the layout is explicit and the same on
every run, which SPREAD only makes likely.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollgym.errors import LaunchError, RollgymError

T = TypeVar("T")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str


def connect(address: str | None) -> bool:
    """Join the Ray cluster at ``address`` ("auto": the one started on this machine); None:
    ``RAY_ADDRESS``, else start a new local Ray. Return True when this call initialised Ray
    (so the caller shuts it down)."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"logging_level": "WARNING"}
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        # "local", not None: given None, Ray joins the last cluster recorded on this machine,
        # and waits for it even when it is long gone.
        address = "local"
        options["include_dashboard"] = False  # start only what a run needs
    ray.init(address=address, **options)
    return True


def alive_nodes() -> list[NodeInfo]:
    """The cluster's live nodes, in a stable order (head first, then by id)."""
    every: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = [n for n in every if n.get("Alive")]
    nodes.sort(key=lambda n: ("node:__internal_head__" not in n.get("Resources", {}), n["NodeID"]))
    if not nodes:
        raise LaunchError("the Ray cluster has no live node")
    return [NodeInfo(n["NodeID"], n["NodeManagerAddress"]) for n in nodes]


def spread(items: Sequence[T], nodes: Sequence[NodeInfo]) -> list[tuple[T, NodeInfo]]:
    """Pair ``items`` with nodes round-robin, in order."""
    return [(item, nodes[i % len(nodes)]) for i, item in enumerate(items)]


def on_node(node: NodeInfo, *, soft: bool) -> NodeAffinitySchedulingStrategy:
    """Run on ``node``; ``soft``: elsewhere if that node is gone (a restarted worker)."""
    return NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=soft)


def unwrap(exc: BaseException) -> BaseException:
    """Our error inside a ``RayTaskError``, as the plain (picklable) object; else ``exc``."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, RollgymError):
        return exc.cause
    return exc


async def get(refs: Any, timeout: float) -> Any:
    """Await a Ray object ref (or a list of them) with a timeout; our errors come out plain."""
    try:
        if isinstance(refs, list):
            return await asyncio.wait_for(asyncio.gather(*refs), timeout)
        return await asyncio.wait_for(_await(refs), timeout)
    except RayTaskError as exc:
        raise unwrap(exc) from None


async def _await(ref: Any) -> Any:
    return await ref
