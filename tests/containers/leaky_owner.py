"""A process that makes leased containers (and now and then a snapshot image) until it is
killed: the SIGKILL test (``test_lease.py``) kills it at random points."""

from __future__ import annotations

import asyncio
import sys

from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.runtime import Limits, Spec


async def main(image: str, run: str) -> None:
    runtime = PodmanRuntime()
    spec = Spec(image=image, limits=Limits(memory_mb=128, pids=64), lease=new_lease(run, 600))
    count = 0
    print("ready", flush=True)
    while True:
        box = await runtime.create(spec, timeout=60)
        count += 1
        print(f"created {box.id}", flush=True)
        await box.exec("echo hi > /tmp/x; sleep 30 &", timeout=5)
        if count % 2 == 0:
            print(f"snapshot {await box.snapshot(timeout=60)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
