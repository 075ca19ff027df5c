"""rollgym's collector as a client of NeMo Gym 0.7's Environment Servers, and the two other
forms a materialized task row takes on its way to a server.

    Episode.of(row)            a stamped materialized row -> its episodes (one per attempt)
      .request(attempt)        POST /run {episode_id: {rollout_id, attempt}, task: {task_id, task_input}}
      .read(answer, ...)       {episode_id, task_id, result | failure} -> the verified record,
                               or the failure as a typed error
    flat_row(row)              a stamped materialized row as the flat row an agent's /run takes
    flat_failure(answer, ...)  0.7's flattened failure (``single_agent_turn_legacy``) as an error
    episodes_only(err, ...)    a flat row's 422 from a native Environment Server as the
                               ConfigError it is (kind: environment, materialized rows)

A rollout's id is ``<_ng_task_index>-<_ng_rollout_index>``, as 0.7's collector makes it; it is
the same for every attempt, and ``attempt`` counts the tries before this one (0 first). A
``failure`` becomes the typed error of ``rollgym.nemo_gym.failures.error_from_failure``, which
keeps ``terminal`` (its ``retryable`` is ``not terminal``), ``stage`` and ``failure_kind``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from rollgym.config import format_validation_error
from rollgym.errors import ConfigError, ProtocolError, RollgymError
from rollgym.nemo_gym.episodes import (
    CREATE_PARAMS,
    EpisodeId,
    EpisodeResponse,
    TaskId,
    is_episode_response,
    split_task_input,
)
from rollgym.nemo_gym.failures import error_from_failure
from rollgym.nemo_gym.mask import lifted
from rollgym.nemo_gym.wire import (
    AGENT_OWN_FIELDS,
    ATTEMPT,
    EPISODE_ID,
    FAILURE,
    FAILURE_REASON,
    NG_FAILURE_CLASS,
    NG_FAILURE_MESSAGE,
    NG_FAILURE_STAGE,
    NG_FAILURE_TERMINAL,
    NG_ROLLGYM_AGENT,
    NG_TASK_ID,
    ROLLOUT_ID,
    TASK,
    TASK_ID,
    TASK_INPUT,
)
from rollgym.protocol import check_verified
from rollgym.wire import COST_FIELD, NG_ROLLOUT_INDEX, NG_TASK_INDEX, STAGE, TERMINAL

RUN_ENDPOINT = "/run"
ROW_INDEX_FIELDS = ("task_index", "rollout_index", NG_TASK_INDEX, NG_ROLLOUT_INDEX)
"""The indices ``tasks.jsonl`` stamps on every row; a flat row built from a materialized one
carries them as every flat row does."""
REASON_LIMIT = 2000  # 0.7's EpisodeFailure.failure_reason max_length
_EPISODE_ID_REFUSED = re.compile(r'"loc"\s*:\s*\[\s*"body"\s*,\s*"episode_id"\s*\]')
"""FastAPI's validation error at the request's ``episode_id`` (found in a body cut short too:
each error's ``loc`` comes before the ``input`` it echoes)."""


def rollout_id(row: dict[str, Any]) -> str:
    """0.7's rollout id of a stamped row: ``<_ng_task_index>-<_ng_rollout_index>``."""
    return f"{row[NG_TASK_INDEX]}-{row[NG_ROLLOUT_INDEX]}"


@dataclass(frozen=True, slots=True)
class Episode:
    """A rollout of a materialized row on an Environment Server: every attempt is an episode
    of the same rollout id, ``attempt`` 0, 1, ..."""

    rollout_id: str
    task_id: dict[str, str]
    task: bytes
    """``{task_id, task_input}`` as sent, encoded once for every attempt."""
    ng_task_index: int

    @classmethod
    def of(cls, row: dict[str, Any]) -> Episode:
        """The episodes of a stamped materialized row (``tasks.jsonl``'s line)."""
        task_id = dict(row[TASK_ID])
        task = orjson.dumps({TASK_ID: task_id, TASK_INPUT: row[TASK_INPUT]})
        return cls(rollout_id(row), task_id, task, int(row[NG_TASK_INDEX]))

    def request(self, attempt: int) -> bytes:
        """The body of ``POST /run`` for attempt ``attempt`` (0 first)."""
        episode_id = orjson.dumps({ROLLOUT_ID: self.rollout_id, ATTEMPT: attempt})
        return b'{"%s":%s,"%s":%s}' % (EPISODE_ID.encode(), episode_id, TASK.encode(), self.task)

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        """The record of a ``result`` (the result, with ``_ng_task_id`` and the row's
        ``_ng_task_index``); a ``failure`` raised as its typed error; anything else raised as a
        ``ProtocolError`` naming ``server``."""
        if not is_episode_response(answer):
            raise _bad_answer(
                server, answer, "answered an episode with no episode response "
                "(episode_id, task_id, and result or failure)",
            )  # fmt: skip
        try:
            got = EpisodeResponse.model_validate(answer)
        except ValidationError as exc:
            why = format_validation_error("not an episode response", exc, one_line=True)
            raise _bad_answer(server, answer, why) from None
        if (got.result is None) == (got.failure is None):
            raise _bad_answer(server, answer, "exactly one of result or failure is required")
        sent = (EpisodeId(rollout_id=self.rollout_id, attempt=attempt), TaskId(**self.task_id))
        if (got.episode_id, got.task_id) != sent:
            raise _bad_answer(
                server, answer, f"answered for another episode ({got.episode_id!r}, "
                f"{got.task_id!r}) than the one sent ({sent[0]!r}, {sent[1]!r})",
            )  # fmt: skip
        if got.failure is not None:
            failure = dict(answer[FAILURE])
            spent = failure.pop(COST_FIELD, None)  # a rollgym agent's spend, not 0.7's
            err = error_from_failure(failure, server=server, endpoint=RUN_ENDPOINT)
            if isinstance(spent, dict) and err.body is None:
                # Where the collector takes a failed attempt's spend from (``spent_before``).
                err = err.with_fields(body=orjson.dumps({COST_FIELD: spent}).decode())
            raise err
        assert got.result is not None
        verified = check_verified(lifted(got.result), server, what="the episode's result came")
        # A rollgym agent's own numbers come back where the flat /run puts them (the result's
        # own top-level fields win: they are the environment's).
        own = verified.pop(NG_ROLLGYM_AGENT, None)
        if isinstance(own, dict):
            verified = {key: own[key] for key in AGENT_OWN_FIELDS if key in own} | verified
        # The collector's own fields win over a result that carries them (0.7 refuses one).
        return {**verified, NG_TASK_ID: self.task_id, NG_TASK_INDEX: self.ng_task_index}


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stamped materialized row as the flat row an agent's ``/run`` takes (rollgym's agents,
    NeMo Gym 0.4's): ``responses_create_params`` and ``task_data``'s fields, with the flat
    fields of ``task_input`` merged in as 0.7 merges them, and the row's indices.
    ``InvalidRequest`` for a task input that 0.7 refuses too (``split_task_input``)."""
    params, data = split_task_input(row[TASK_INPUT])
    flat = {CREATE_PARAMS: params, **data}
    flat.update((key, row[key]) for key in ROW_INDEX_FIELDS if key in row)
    return flat


def flat_failure(answer: Any, server: str) -> RollgymError | None:
    """The error of a flat answer that is 0.7's flattened failure (``_ng_failure_class``, no
    ``reward``: what ``single_agent_turn_legacy`` answers a flat row with); else None."""
    if not isinstance(answer, dict) or NG_FAILURE_CLASS not in answer or "reward" in answer:
        return None
    reason = answer.get(NG_FAILURE_MESSAGE) or answer[NG_FAILURE_CLASS]
    failure: dict[str, Any] = {
        FAILURE_REASON: str(reason)[:REASON_LIMIT],
        TERMINAL: bool(answer.get(NG_FAILURE_TERMINAL, False)),
    }
    if answer.get(NG_FAILURE_STAGE) is not None:
        failure[STAGE] = answer[NG_FAILURE_STAGE]
    return error_from_failure(failure, server=server, endpoint=RUN_ENDPOINT)


def episodes_only(err: RollgymError, server: str) -> ConfigError | None:
    """``err`` as the configuration error it is when server ``server`` refused a flat row with
    0.7's 422 for a body without ``episode_id`` (FastAPI's ``loc: ["body", "episode_id"]``): a
    native 0.7 Environment Server (``single_agent_turn``, ...) given as an agent, or given flat
    rows. Every row would fail alike, so the run is told what to change; else None."""
    if err.type != "http_status" or err.status != 422 or not err.body:
        return None
    if not _EPISODE_ID_REFUSED.search(err.body):
        return None
    return ConfigError(
        f"{server} answered 422 on POST /run: it takes only NeMo Gym 0.7 episodes "
        "({episode_id, task}; 'episode_id' missing), so it is a 0.7 Environment Server, not "
        f"an agent. Declare it servers.{server}.kind: environment and give it materialized "
        'task rows ({"task_id": {"taskset": ..., "task_id": ...}, "task_input": {...}}, '
        "routed to it by collect.taskset_routes when the run has more than one server); flat "
        "rows go to agents and to 0.7's legacy_agent relays",
        status=422, server=server, endpoint=RUN_ENDPOINT, origin=err,
    )  # fmt: skip


def _bad_answer(server: str, answer: Any, why: str) -> ProtocolError:
    return ProtocolError(
        f"{server}: {why}", server=server, endpoint=RUN_ENDPOINT, body=_body(answer),
        retryable=False,
    )  # fmt: skip


def _body(answer: Any) -> bytes:
    try:
        return orjson.dumps(answer)[:2000]
    except TypeError:
        return repr(answer)[:2000].encode()
