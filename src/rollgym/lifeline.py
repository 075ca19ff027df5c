"""Tie a child process's life to its parent's (Linux), so no worker outlives its server.

Kept free of heavy imports: process-pool workers run it as their initializer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit at once if
    the parent (``parent`` pid, when given) is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def pool_worker_lifeline(parent: int, pids: Any = None) -> None:
    """Initializer for process-pool workers: SIGKILL with the parent (``parent`` pid), and exit
    at once if it died while this worker was starting. ``pids``: a multiprocessing queue this
    worker's pid is put on, so the parent can kill it (``rollgym.server.cpu_pool``)."""
    die_with_parent(signal.SIGKILL, parent)
    if pids is not None:
        pids.put(os.getpid())
