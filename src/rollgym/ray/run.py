"""``run_on_ray``: ``rollgym run --ray``, a whole run with servers and collection on a cluster."""

from __future__ import annotations

import time
from pathlib import Path

import ray

from rollgym.collect import RunOutcome, prepare_run
from rollgym.config import CollectConfig, Config
from rollgym.ray.collector import RayCollector
from rollgym.ray.placement import connect
from rollgym.ray.servers import RayServers


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
    startup_timeout: float = 120.0,
) -> RunOutcome:
    """Validate the input, start the config's servers on the Ray cluster at ``address`` (None:
    ``RAY_ADDRESS``, else a new local one; an already initialised Ray is used as it is), collect
    with ``workers`` actors (default: one per node) into ``out_dir``, stop the servers."""
    prepared = prepare_run(config, collect, input_path, out_dir, resume=resume)
    owns_ray = connect(address)
    try:
        servers = RayServers(config, log_dir=out_dir / "logs", log_level=log_level)
        t0 = time.monotonic()
        try:
            await servers.start(startup_timeout)
            prepared.run_info["startup_seconds"] = round(time.monotonic() - t0, 3)
            collector = RayCollector(
                prepared, servers, agent=agent, progress=progress, workers=workers
            )
            return await collector.execute()
        finally:
            await servers.stop()
    finally:
        if owns_ray:
            ray.shutdown()
