"""``run_on_ray``: ``rollgym run --ray``, the one run orchestration with a Ray launcher (servers
as processes on the cluster's nodes, ``ray.launcher``) and the Ray dispatcher (collect worker
actors)."""

from __future__ import annotations

from pathlib import Path

from rollgym.collect import RolloutPolicy, RunOutcome, run_collection
from rollgym.config import CollectConfig, Config
from rollgym.dialects import ROW_DIALECTS
from rollgym.ray.dispatch import RayDispatcher
from rollgym.ray.launcher import ray_launcher

__all__ = ["run_on_ray"]


async def run_on_ray(
    config: Config,
    collect: CollectConfig,
    input_path: Path,
    out_dir: Path,
    *,
    resume: bool = False,
    agent: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    log_level: str = "WARNING",
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    startup_timeout: float = 120.0,
) -> RunOutcome:
    """Check the config's servers, validate the input, start the servers on the Ray cluster at
    ``address``, collect with ``workers`` actors (default: one per node) into ``out_dir``, stop
    the servers."""
    launcher = ray_launcher(
        config, address=address, log_dir=out_dir / "logs", log_level=log_level,
        startup_timeout=startup_timeout,
    )  # fmt: skip
    dispatcher = RayDispatcher(
        RolloutPolicy.from_collect(collect), collect.concurrency, servers=launcher.servers,
        workers=workers, worker_metrics=metrics_host if metrics_port is not None else None,
    )  # fmt: skip
    return await run_collection(
        config, collect, input_path, out_dir, launcher, dispatcher=dispatcher, resume=resume,
        agent=agent, progress=progress, metrics_port=metrics_port, metrics_host=metrics_host,
        dialects=ROW_DIALECTS,
    )  # fmt: skip
