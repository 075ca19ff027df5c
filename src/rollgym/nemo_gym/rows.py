"""NeMo Gym 0.7's materialized task rows as a row dialect of the collector (``ROWS``).

    {"task_id": {"taskset": ..., "task_id": ...}, "task_input": {...}, "_ng_task_index": ...}

Routed by its taskset (``AgentRoute.server_for_taskset``), a rollout of one goes

- to an environment server (``kind: environment``) as 0.7's episodes: the item's row is the
  stamped line of ``tasks.jsonl``, attempt N sent as ``Episode.of(row).request(N - 1)``; a
  ``result`` is the verified record, a ``failure`` the typed error of ``error_from_failure``.
  Episodes are the environment server's to retry: a non-terminal failure (or any other
  retryable one) is run again as the next attempt (the same ``rollout_id``, after the server's
  backoff) while its ``retry.max_attempts`` allows;
- to an agent as the flat row its ``/run`` takes (``environment_client.flat_row``): rollgym's
  agents and NeMo Gym 0.4's read no other form.

Either way every record of it carries ``_ng_task_id`` (the verified record, and the line in
``failures.jsonl``, which also carries what a 0.7 reader of its ``<stem>_failures.jsonl``
sidecar reads: ``failures.record_fields``). A ``mask_sample`` said only in NeMo RL's
``instance_config`` is lifted to the top, where rollgym reads it.

Any row's failure from a 0.7 server is read as it meant it (``foreign``): a native Environment
Server's 422 to a flat row (``episodes_only``: a configuration to fix), a legacy relay's
flattened failure (``flat_failure``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from rollgym.collect.dialect import RowCheck, reason
from rollgym.collect.records import RolloutItem
from rollgym.collect.route import BY_TASKSET, AgentRoute
from rollgym.errors import ConfigError, InputError, InvalidRequest, RollgymError
from rollgym.nemo_gym.environment_client import Episode, episodes_only, flat_failure, flat_row
from rollgym.nemo_gym.episodes import CREATE_PARAMS, TaskId, is_materialized_row
from rollgym.nemo_gym.failures import record_fields
from rollgym.nemo_gym.mask import lifted
from rollgym.nemo_gym.wire import (
    NG_ATTEMPT_INDEX,
    NG_ROLLOUT_ID,
    NG_TASK_ID,
    TASK_ID,
    TASK_INPUT,
    TASKSET,
)
from rollgym.protocol import TaskRow, check_verified


class _Materialized(BaseModel):
    """What rollgym reads of a materialized row itself: its task id (0.7's ``TaskId``)."""

    model_config = ConfigDict(extra="allow")
    task_id: TaskId


@dataclass(frozen=True, slots=True)
class TaskRollout:
    """What a work item of a materialized row carries (``RolloutItem.context``): its task id,
    and whether its row goes as episodes (to an environment server) or flat (to an agent)."""

    task_id: dict[str, str]
    episode: bool


@dataclass(frozen=True, slots=True)
class EpisodeExchange:
    """The attempts of a rollout sent to an environment server: episodes of one rollout id."""

    episode: Episode
    server_retries: bool = True

    def request(self, attempt: int) -> bytes:
        # 0.7 numbers an episode's attempts from 0: the tries before this one.
        return self.episode.request(attempt - 1)

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        return self.episode.read(answer, attempt - 1, server)

    def fields(self, err: RollgymError) -> dict[str, Any]:
        return {NG_TASK_ID: self.episode.task_id, **record_fields(err)}


@dataclass(frozen=True, slots=True)
class FlatTaskExchange:
    """The attempts of a materialized row sent to an agent: its flat row, as a flat row's."""

    row: bytes
    task_id: dict[str, str]
    server_retries: bool = False

    def request(self, attempt: int) -> bytes:
        return self.row

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        # A 0.7 relay forwards the agent's verify response, or answers its flattened failure.
        failed = flat_failure(answer, server)
        if failed is not None:
            raise failed
        return {**check_verified(lifted(answer), server), NG_TASK_ID: self.task_id}

    def fields(self, err: RollgymError) -> dict[str, Any]:
        return {NG_TASK_ID: self.task_id, **record_fields(err)}


class MaterializedRows:
    """NeMo Gym 0.7's materialized rows (the module docstring)."""

    name = "nemo_gym_0.7"
    marker = b'"task_input"'

    def check(self, row: dict[str, Any], route: AgentRoute | None, where: str) -> RowCheck | None:
        if not is_materialized_row(row):
            return None
        try:
            task_id = _Materialized.model_validate(row).task_id
        except ValidationError as exc:
            raise InputError(f"{where}: {reason(exc)}") from None
        if not isinstance(row[TASK_INPUT], dict):
            raise InputError(f"{where}: {TASK_INPUT} must be a JSON object")
        for key in (CREATE_PARAMS, "agent_ref"):
            if key in row:
                raise InputError(
                    f"{where}: a materialized row ({TASK_ID} + {TASK_INPUT}) has no top-level "
                    f"{key}: its create params are in {TASK_INPUT}, its server is its "
                    f"{TASKSET}'s route"
                )
        restamp = frozenset({NG_ROLLOUT_ID, NG_ATTEMPT_INDEX})  # one per rollout
        done = RowCheck(BY_TASKSET, task_id.taskset, frozenset(), restamp)
        if route is None:
            return done  # its server unknown: nothing more to say of the row alone
        server = route.server_for_taskset(task_id.taskset)
        if server is None:
            raise InputError(f"{where}: {route.taskset_refusal(task_id.taskset)}")
        if server in route.environments:
            return done  # its task input is the environment server's to read
        # Sent to an agent as a flat row: it must be one (0.7 refuses the same task inputs).
        try:
            flat = flat_row(row)
        except InvalidRequest as exc:
            raise InputError(f"{where}: {TASK_INPUT}: {exc.message}") from None
        try:
            TaskRow.model_validate(flat)
        except ValidationError as exc:
            raise InputError(f"{where}: {TASK_INPUT}: {reason(exc)}") from None
        return RowCheck(BY_TASKSET, task_id.taskset, frozenset(flat), restamp)

    def item(
        self, task_index: int, rollout_index: int, raw: bytes, row: dict[str, Any],
        route: AgentRoute, prior: int,
    ) -> RolloutItem | None:  # fmt: skip
        if not is_materialized_row(row):
            return None
        taskset = row[TASK_ID][TASKSET]
        server = route.server_for_taskset(taskset)
        if server is None:  # refused when the run was prepared: the file changed since
            raise ConfigError(f"no server runs taskset {taskset!r}")
        episode = server in route.environments
        body = raw if episode else orjson.dumps(flat_row(row))
        context = TaskRollout(dict(row[TASK_ID]), episode)
        return RolloutItem(
            task_index, rollout_index, body, server, prior, dialect=self.name, context=context
        )

    def exchange(self, item: RolloutItem) -> EpisodeExchange | FlatTaskExchange:
        task = item.context
        assert isinstance(task, TaskRollout)
        if task.episode:
            return EpisodeExchange(Episode.of(orjson.loads(item.row)))
        return FlatTaskExchange(item.row, task.task_id)

    def foreign(self, err: RollgymError, answer: Any, server: str) -> RollgymError | None:
        if answer is not None and err.type == "protocol_error":
            return flat_failure(answer, server)
        return episodes_only(err, server)


ROWS = MaterializedRows()

__all__ = ["ROWS", "EpisodeExchange", "FlatTaskExchange", "MaterializedRows", "TaskRollout"]
