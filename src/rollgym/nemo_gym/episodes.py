"""NeMo Gym 0.7's Environment Server episodes as typed records, and its materialized task rows.

    POST /run  {episode_id: {rollout_id, attempt}, task: {task_id: {taskset, task_id}, task_input}}
            -> {episode_id, task_id, result | failure}

``task_input`` of a ``single_agent_turn`` episode is ``{responses_create_params, task_data}``,
where 0.7 moves every other flat field into ``task_data`` (the same value inside and outside is
fine; two different values are refused). A materialized task row is the ``task`` part,
``{task_id: {taskset, task_id}, task_input}``, with the collector's index fields beside it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollgym.errors import InvalidRequest
from rollgym.nemo_gym.wire import EPISODE_ID, FAILURE, RESULT, TASK, TASK_DATA, TASK_ID, TASK_INPUT
from rollgym.wire import ROLLOUT_ID_PATTERN

CREATE_PARAMS = "responses_create_params"


class EpisodeId(BaseModel):
    """Names one attempt at one rollout; ``capture_key`` is what 0.7 puts in ``/ng-rollout/``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    rollout_id: str = Field(min_length=1, pattern=ROLLOUT_ID_PATTERN)
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, value: str) -> str:
        # 0.7 refuses an id ending in -a<N> (N >= 1): that suffix is how it spells an attempt.
        head, sep, tail = value.rpartition("-a")
        if sep and head and tail.isdigit() and int(tail) >= 1:
            raise ValueError(f"rollout_id {value!r} ends in an attempt suffix (-a{tail})")
        return value

    @property
    def capture_key(self) -> str:
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"


class TaskId(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class MaterializedTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: TaskId
    task_input: dict[str, Any]


class EpisodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    episode_id: EpisodeId
    task: MaterializedTask


class EpisodeFailure(BaseModel):
    """0.7's ``EpisodeFailure``: ``terminal`` means "do not try this episode again"."""

    model_config = ConfigDict(extra="allow")
    failure_reason: str = Field(max_length=2000)
    terminal: bool
    failure_kind: str | None = None
    stage: str | None = None


class EpisodeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    episode_id: EpisodeId
    task_id: TaskId
    result: dict[str, Any] | None = None
    failure: EpisodeFailure | None = None


def is_episode_request(body: Any) -> bool:
    """Whether a ``/run`` body is a 0.7 episode request (else a flat task row)."""
    return isinstance(body, dict) and EPISODE_ID in body and TASK in body


def is_episode_response(body: Any) -> bool:
    """Whether a ``/run`` answer is a 0.7 episode response."""
    return (
        isinstance(body, dict)
        and EPISODE_ID in body
        and TASK_ID in body
        and (RESULT in body or FAILURE in body)
    )


def is_materialized_row(row: Any) -> bool:
    """0.7's test: ``task_id`` is an object and ``task_input`` is present."""
    return isinstance(row, dict) and isinstance(row.get(TASK_ID), dict) and TASK_INPUT in row


def split_task_input(task_input: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(responses_create_params, task_data)`` of a ``single_agent_turn`` task input, with its
    flat fields merged into ``task_data`` as 0.7 does. ``InvalidRequest`` (422) for a field given
    inside and outside ``task_data`` with different values, or a missing create params."""
    params = task_input.get(CREATE_PARAMS)
    if not isinstance(params, dict):
        raise InvalidRequest(f"task_input has no {CREATE_PARAMS} object", status=422)
    data = task_input.get(TASK_DATA, {})
    if not isinstance(data, dict):
        raise InvalidRequest(f"task_input.{TASK_DATA} must be a JSON object", status=422)
    merged = dict(data)
    for key, value in task_input.items():
        if key in (CREATE_PARAMS, TASK_DATA):
            continue
        if key in merged and merged[key] != value:
            raise InvalidRequest(
                f"conflicting task field {key!r} inside and outside {TASK_DATA}", status=422
            )
        merged[key] = value
    return params, merged
