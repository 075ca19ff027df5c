"""The trainer-facing API: collect rollouts from inside a training loop.

- ``client``: ``RolloutClient``, a batch of task rows in, one ``TaskGroup`` per row out
  (``collect``, ``collect_sync``), and ``stream`` for asynchronous training;
- ``group``: ``TaskGroup``, a row's rollouts and what is scored, masked, failed or stale;
- ``stream``: ``RolloutStream``, groups in completion order with back-pressure, a failure rule,
  bounded staleness and pause/resume; ``feed`` (rows in, groups out), ``staleness`` (the
  judge of a rollout's policy versions) and ``stream_ledger`` (its run directory) are its parts;
- ``policy_control``: ``PolicyControl``, pause the model servers, load weights, resume.

None of it imports Ray. The names below are what trainers import (``from rollgym.trainer
import RolloutClient``).
"""

from __future__ import annotations

from rollgym.collect.failure_budget import BudgetRules
from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout
from rollgym.trainer.client import (
    DEFAULT_BUDGET,
    BatchOptions,
    RolloutClient,
    SyncStream,
    collect_batch,
    collect_batch_sync,
    plain_error,
)
from rollgym.trainer.feed import StreamStats
from rollgym.trainer.group import TaskGroup
from rollgym.trainer.policy_control import PolicyControl
from rollgym.trainer.stream import RolloutStream

__all__ = [
    "DEFAULT_BUDGET",
    "BatchOptions",
    "BudgetRules",
    "FailedRollout",
    "PolicyControl",
    "RolloutClient",
    "RolloutRecord",
    "RolloutStream",
    "ScoredRollout",
    "StreamStats",
    "SyncStream",
    "TaskGroup",
    "collect_batch",
    "collect_batch_sync",
    "plain_error",
]
