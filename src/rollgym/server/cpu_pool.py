"""A process pool for CPU-bound checks whose workers can be killed.

A stuck verifier cannot be stopped in a thread, and ``ProcessPoolExecutor`` offers no public
way to kill its workers: so each worker reports its pid when it starts (through a queue given to
its initializer), and the calls in flight are tracked here. Workers use ``spawn`` (a fork of a
process running an event loop and threads is unsafe) and die with the server.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from rollgym.lifeline import pool_worker_lifeline

WARM_UP_TIMEOUT = 120.0
"""Seconds a pool's workers have to start and warm up (``warm``); the launcher's warm-up bound
(``rollgym.launch.timeouts.WARMUP_TIMEOUT``) is longer, so a server's own failure is what it
reports."""


class CpuPool:
    """``workers`` spawn processes; ``kill`` ends them at once, whatever they are doing."""

    def __init__(self, workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._pids_queue = context.SimpleQueue()
        self._pids: set[int] = set()
        self.executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=pool_worker_lifeline,  # a worker must not outlive its server
            initargs=(os.getpid(), self._pids_queue),
        )
        self.pending: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future = self.executor.submit(fn, *args)
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)
        return future

    def others(self, job: Future[Any]) -> list[Future[Any]]:
        """The calls other than ``job`` still queued or running."""
        return [f for f in list(self.pending) if f is not job and not f.done()]

    def kill(self) -> None:
        """SIGKILL every worker (a stuck one would spin on after a shutdown), then shut down."""
        while not self._pids_queue.empty():
            self._pids.add(self._pids_queue.get())
        for pid in self._pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._pids_queue.close()


def warm(module: str) -> None:
    """Import ``module`` in a worker before the first real call (imports take seconds), and run
    its ``warm_up()`` if it has one (what its first call would otherwise pay: lazy imports,
    caches)."""
    warm_up = getattr(importlib.import_module(module), "warm_up", None)
    if callable(warm_up):
        warm_up()
    time.sleep(0.05)  # hold this worker so the next warm-up call lands on another one
