"""Kept only so ``rollgym.audit.containers`` (another branch's file) still imports: delete this
module once it drops its ``wrap_for_loop`` call.

It ran every container call on a stock asyncio loop in a thread, because under uvloop a
``podman run -d`` hung: the child's duplicated pipes reached conmon. ``containers/podman.py``'s
``run`` now marks every descriptor past stdio close-on-exec in the child, and the container
tests pass on uvloop, so no wrapper is needed.
"""

from __future__ import annotations

from rollgym.containers.runtime import Runtime


def wrap_for_loop(runtime: Runtime) -> Runtime:
    """``runtime`` as is (podman works on any loop now)."""
    return runtime
