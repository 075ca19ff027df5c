"""A materialized task row (NeMo Gym 0.7) in a run: the work item that says how it is sent,
and the failure record that keeps its task id.

    {"task_id": {"taskset": ..., "task_id": ...}, "task_input": {...}, "_ng_task_index": ...}

Routed by its taskset (``tasks.AgentRoute.server_for_taskset``), a rollout of one goes

- to an environment server (``kind: environment``) as 0.7's episodes: ``row`` is the stamped
  line of ``tasks.jsonl``, and the rollout core sends ``Episode.of(row).request(attempt)``;
- to an agent as the flat row its ``/run`` takes (``environment_client.flat_row``): rollgym's
  agents and NeMo Gym 0.4's read no other form.

Either way every record of it carries ``_ng_task_id``: a success through its verified record,
a failure through ``TaskFailedRollout``. Both are the ledger's record types with one field
more, so every sink, dispatcher (Ray's too) and reader takes them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from rollgym.collect.records import FailedRollout, RolloutItem
from rollgym.nemo_gym.environment_client import flat_row
from rollgym.wire import NG_TASK_ID, TASK_ID


@dataclass(frozen=True, slots=True)
class TaskItem(RolloutItem):
    """A rollout of a materialized row. ``episode``: ``row`` is the stamped materialized row,
    sent as episodes; else ``row`` is its flat form, sent as it is."""

    task_id: dict[str, str] | None = None
    episode: bool = False


@dataclass(frozen=True, slots=True)
class TaskFailedRollout(FailedRollout):
    """A failed rollout of a materialized row: ``failures.jsonl``'s line with ``_ng_task_id``."""

    task_id: dict[str, str] | None = None

    def to_json(self) -> bytes:
        line = FailedRollout.to_json(self)
        if self.task_id is None:
            return line
        record = orjson.loads(line)
        return orjson.dumps({NG_TASK_ID: self.task_id, **record})


def task_item(
    task_index: int,
    rollout_index: int,
    raw: bytes,
    row: dict[str, Any],
    server: str,
    prior_attempts: int,
    *,
    episode: bool,
) -> TaskItem:
    """The work item of one rollout of the stamped materialized ``row`` (``raw``: its line of
    ``tasks.jsonl``), run by ``server`` (an environment server when ``episode``)."""
    task_id = dict(row[TASK_ID])
    body = raw if episode else orjson.dumps(flat_row(row))
    return TaskItem(
        task_index, rollout_index, body, server, prior_attempts, task_id=task_id, episode=episode
    )
