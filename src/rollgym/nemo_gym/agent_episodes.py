"""NeMo Gym 0.7 episodes on an agent's ``POST /run``, so that an agent is an Environment Server::

    {episode_id: {rollout_id, attempt}, task: {task_id: {taskset, task_id}, task_input}}
        -> 200 {episode_id, task_id, result: <verify response>, failure: null}
        -> 200 {episode_id, task_id, result: null, failure: {failure_reason, terminal, ...}}

The task input is a ``single_agent_turn`` one: ``responses_create_params`` and ``task_data``,
with its other flat fields merged into ``task_data`` as 0.7 does. The rollout is the one a flat
row runs (``task_data`` fields + ``responses_create_params`` are the row), so the result is what
the flat ``/run`` answers, but for the agent's own numbers (``num_steps``, ``truncated``,
``agent_seconds``, ``drifted_turns``), which sit under ``_rollgym_agent``: 0.7 aggregates every
numeric top-level field of a result (as ``mean/num_steps``...) but none starting with ``_``, and
rollgym's collector puts them back at the top. A rollout that fails is a 200 with the failure
(0.7's vocabulary, ``rollgym.nemo_gym.failures``), its ``stage`` the phase that failed
(``STAGES``), with what the rollout spent before it failed (``rollgym_cost``, as the flat
``/run`` answers a failure); a body that is no episode request is a 422 naming the field.

The rollout's id (``x-rollgym-rollout`` on its calls, its sticky key) is the episode's
``capture_key``: ``rollout_id``, or ``rollout_id-a<attempt>`` for a later attempt, as 0.7 names
the rollout in ``/ng-rollout/<id>/``. Each attempt is a rollout of its own (a new resources
session; nothing of an earlier attempt is kept or looked up); the same episode sent twice runs
twice, as a flat row does: the agent holds no state between requests.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from rollgym.config import format_validation_error
from rollgym.errors import InvalidRequest, RollgymError
from rollgym.nemo_gym.episodes import (
    CREATE_PARAMS,
    EpisodeId,
    EpisodeRequest,
    TaskId,
    is_episode_request,
    split_task_input,
)
from rollgym.nemo_gym.failures import Stage, episode_failure
from rollgym.nemo_gym.wire import (
    AGENT_OWN_FIELDS,
    EPISODE_ID,
    FAILURE,
    NG_ROLLGYM_AGENT,
    RESULT,
    TASK_ID,
)
from rollgym.protocol import TaskRow
from rollgym.server.agent import Phase
from rollgym.wire import COST_FIELD

MAX_ID_CHARS = 256
"""Episode and task ids, and an episode's capture key, are at most this long (0.7 sets no
bound): the key travels in a header of every call of the rollout, and in 0.7's
``/ng-rollout/<key>/`` paths, which rollgym's servers take up to this length."""


STAGES: dict[Phase, Stage] = {"seed": "seed", "agent": "agent", "verify": "verification"}
"""0.7's failure stage of each phase of a rollout (``rollgym.server.agent.failed_phase``)."""


def is_episode_body(body: Any) -> bool:
    """Whether ``/run`` should read ``body`` as an episode request: it has ``episode_id`` and
    ``task``, or ``episode_id`` and no create params (so a half episode is told what it lacks,
    not that it is a bad task row)."""
    return is_episode_request(body) or (
        isinstance(body, dict) and EPISODE_ID in body and CREATE_PARAMS not in body
    )


def read_episode(body: Any) -> tuple[EpisodeRequest, dict[str, Any]]:
    """The episode request in ``body`` and the task row it runs; a 422 naming the field."""
    try:
        request = EpisodeRequest.model_validate(body)
    except ValidationError as exc:
        message = format_validation_error("/run: not a valid episode request", exc, one_line=True)
        raise InvalidRequest(message, status=422) from None
    check_ids(request.episode_id, request.task.task_id, "/run")
    params, data = split_task_input(request.task.task_input)
    row = {**data, CREATE_PARAMS: params}
    try:
        TaskRow.model_validate(row)
    except ValidationError as exc:
        message = format_validation_error(
            "/run: not a valid task", exc, prefix="task.task_input", one_line=True
        )
        raise InvalidRequest(message, status=422) from None
    return request, row


def check_ids(
    episode_id: EpisodeId, task_id: TaskId | None, where: str, task_at: str = "task.task_id"
) -> None:
    """Refuse (422) an id longer than ``MAX_ID_CHARS``, naming it (the task id's fields as
    ``task_at.taskset`` / ``task_at.task_id``)."""
    # The capture key is the rollout id plus -a<attempt>: bounding it bounds both.
    key = episode_id.capture_key
    if len(key) > MAX_ID_CHARS:
        raise InvalidRequest(
            f"{where}: episode_id.rollout_id: its rollout id (with -a<attempt> after a first "
            f"attempt) has {len(key)} characters, more than the {MAX_ID_CHARS} allowed",
            status=422,
        )
    if task_id is None:
        return
    for name, value in (("taskset", task_id.taskset), ("task_id", task_id.task_id)):
        if len(value) > MAX_ID_CHARS:
            raise InvalidRequest(
                f"{where}: {task_at}.{name}: {len(value)} characters, more than the "
                f"{MAX_ID_CHARS} allowed",
                status=422,
            )


def episode_result(request: EpisodeRequest, result: dict[str, Any]) -> dict[str, Any]:
    """The episode response for a verified rollout (its verify response, the agent's own
    numbers moved under ``_rollgym_agent`` so 0.7's aggregate metrics leave them out)."""
    own = {key: result[key] for key in AGENT_OWN_FIELDS if key in result}
    if own:
        result = {k: v for k, v in result.items() if k not in own}
        result[NG_ROLLGYM_AGENT] = own
    return _response(request, result=result)


def episode_failed(
    request: EpisodeRequest,
    err: RollgymError,
    phase: Phase | None,
    spent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The episode response for a rollout that failed with ``err`` in ``phase``; ``spent``:
    what it spent before it failed (``Hops.spent``), carried in the failure as
    ``rollgym_cost`` (0.7's ``EpisodeFailure`` takes extra fields) for rollgym's collector."""
    stage = None if phase is None else STAGES[phase]
    failure = episode_failure(err, stage)
    if spent is not None:
        failure[COST_FIELD] = spent
    return _response(request, failure=failure)


def _response(
    request: EpisodeRequest,
    *,
    result: dict[str, Any] | None = None,
    failure: dict[str, Any] | None = None,
) -> dict[str, Any]:
    # Both keys, the other null: as 0.7's own Environment Servers answer.
    return {
        EPISODE_ID: request.episode_id.model_dump(),
        TASK_ID: request.task.task_id.model_dump(),
        RESULT: result,
        FAILURE: failure,
    }


__all__ = [
    "MAX_ID_CHARS",
    "STAGES",
    "check_ids",
    "episode_failed",
    "episode_result",
    "is_episode_body",
    "read_episode",
]
