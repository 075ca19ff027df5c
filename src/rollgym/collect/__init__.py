"""Collection: tasks in, one record per rollout out, resumable, with metrics.

The path of one run (see the README's architecture section)::

    RunAgents, local_launcher        the run's agents and servers, decided once (launchers.py)
    run_collection (orchestrate.py)  launcher up -> Collector -> launcher down
      Collector (collector.py)       pending items -> dispatcher -> recorder -> metrics, run.json
      Dispatcher (dispatch.py)       LocalDispatcher here, RayDispatcher on a cluster
      RolloutRunner (rollout.py)     one rollout -> one ScoredRollout | FailedRollout
      Recorder (recorder.py)         sink (ledger files | memory), progress, failure budget
      Dialects (dialect.py)          how each row shape is checked, routed, sent, read and
                                     recorded: the flat row built in, others listed by the
                                     entry points (rollgym.dialects)
"""

from rollgym.collect.collector import Collector
from rollgym.collect.dispatch import Dispatcher, LocalDispatcher
from rollgym.collect.launchers import Launcher, RunAgents, RunningServers, local_launcher
from rollgym.collect.orchestrate import run_collection
from rollgym.collect.recorder import MemorySink, Recorder
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord, ScoredRollout
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.collect.rundir import (
    EXIT_ABORTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    PreparedRun,
    RunOutcome,
    mark_failed_to_start,
    prepare_run,
)

__all__ = [
    "EXIT_ABORTED",
    "EXIT_OK",
    "EXIT_SOME_FAILED",
    "Collector",
    "Dispatcher",
    "FailedRollout",
    "Launcher",
    "LocalDispatcher",
    "MemorySink",
    "PreparedRun",
    "Recorder",
    "RolloutItem",
    "RolloutPolicy",
    "RolloutRecord",
    "RolloutRunner",
    "RunAgents",
    "RunOutcome",
    "RunningServers",
    "ScoredRollout",
    "local_launcher",
    "mark_failed_to_start",
    "prepare_run",
    "run_collection",
]
