"""Collection: tasks in, one record per rollout out, resumable, with metrics."""

from rollgym.collect.collector import (
    EXIT_ABORTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    Collector,
    PreparedRun,
    RunOutcome,
    prepare_run,
)

__all__ = [
    "EXIT_ABORTED",
    "EXIT_OK",
    "EXIT_SOME_FAILED",
    "Collector",
    "PreparedRun",
    "RunOutcome",
    "prepare_run",
]
