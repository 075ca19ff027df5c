"""How rollgym's own processes run: uvloop, and a garbage collector sized for many rollouts.

Both are for processes rollgym owns (its CLI and its server processes), never for a library
caller's process: the trainer API leaves the caller's loop and collector alone.

**Why the collector is tuned.** CPython's cyclic collector runs a young collection every 700
allocations and, now and then, a full one over every object alive. With thousands of rollouts
in flight, each holding its requests, buffers and tasks, the objects alive at a collection grow
with the concurrency, and so does the cost per rollout: measured on the proxy pipeline at 4,096
in flight, the agent spent half its CPU in collections started from ordinary allocations. A
larger young generation lets short-lived objects die before they are looked at, and ``freeze``
takes everything built at start-up (modules, configs, schemas) out of every later collection.
Reference cycles are still collected, later: a few MB of garbage at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_OWN_PROCESS = False


def claim_process() -> None:
    """Say that this process is one of rollgym's server processes, which a server may end
    when it knows itself broken (its launcher's watchdog then starts a fresh one)."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def owns_process() -> bool:
    """True in a process ``claim_process`` was called in; never in a library caller's."""
    return _OWN_PROCESS


GC_THRESHOLDS = (50_000, 20, 100)
"""Young-generation size and the older generations' ratios (CPython's defaults: 700, 10, 10)."""


def tune_gc() -> None:
    """Freeze what start-up built and raise the collector's thresholds (``GC_THRESHOLDS``).
    Call once, when start-up is done and before the hot loop. Raises the open-files limit too
    (``raise_open_files_limit``): both are for a process about to serve many rollouts."""
    raise_open_files_limit()
    gc.collect()  # what start-up left as garbage goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the new soft
    limit. Every rollout in flight holds a connection in the collector and several in its
    agent: 4,096 in flight need more than the 1,024 many systems start a process with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit (macOS) still needs a number; the kernel may cap it lower.
    targets = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 1 << 16, 10240]
    for target in targets:
        if soft >= target:
            break
        with contextlib.suppress(ValueError, OSError):  # not ours to raise: keep what we have
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop where it is installed (it is, with uvicorn[standard]
    on Linux): a cheaper loop for every socket the collector and the servers serve."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a platform without uvloop
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result
