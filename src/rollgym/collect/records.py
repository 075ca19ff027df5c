"""The one record of a finished rollout, and the work item that asks for one.

Every entry point ends a rollout as one of these two frozen dataclasses: the collector writes
them to ``rollouts.jsonl`` / ``failures.jsonl``, Ray workers send them to the driver, and the
trainer API hands them to the trainer. They pickle (the error is a ``RollgymError``, which is
plain data), so they cross a ``spawn`` process or a Ray actor boundary unchanged.

A **masked** rollout is a ``ScoredRollout`` whose verify response says ``mask_sample: true``
(its reward is no measurement: the environment's infrastructure failed). It is recorded in
``rollouts.jsonl`` with the flag, but it is left out of every reward statistic and never reaches
a trainer as a reward. A ``mask_sample`` that is not a boolean is not guessed either way:
``checked`` turns the rollout into a ``FailedRollout`` with a ``ProtocolError`` naming the value
(``rollgym.protocol.mask_sample``).

A work item and a failure carry what their row's dialect adds (``collect.dialect``): the item
its name and its own data, the failure the fields of its line beside rollgym's.

A scored rollout carries its **integrity** verdict (``rollgym.audit.scan``: ``clean``,
``suspect`` or ``exploit``, and why), given by ``tagged`` as the recorder takes it and written on
its line. With ``collect.mask_exploits`` an ``exploit`` is masked as ``mask_sample`` masks: its
line says ``mask_sample: true`` (any reader of ``rollouts.jsonl`` leaves it out of the rewards,
NeMo RL's too) and its verdict ``masked: true``, saying why. Never a reward of 0.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from rollgym.audit.scan import FIELD, Integrity, scan
from rollgym.errors import ProtocolError, RollgymError
from rollgym.protocol import is_masked, mask_sample
from rollgym.server.versions import rollout_versions
from rollgym.wire import COST_FIELD, INDEX_FIELDS, MASK_SAMPLE, NG_ROLLOUT_INDEX, NG_TASK_INDEX


@dataclass(frozen=True, slots=True)
class RolloutItem:
    """One rollout to run: its indices, the stamped task row (sent as is) and its agent."""

    task_index: int
    rollout_index: int
    row: bytes
    agent: str
    prior_attempts: int = 0
    """Attempts recorded by earlier sessions of the run (``--resume``)."""
    dialect: str = ""
    """The name of its row's dialect (``collect.dialect``; ``""``: the flat row)."""
    context: Any = None
    """Its dialect's own data for this rollout (plain and picklable: it crosses to Ray)."""

    @property
    def key(self) -> str:
        """``task_index:rollout_index``: names the rollout to every server it reaches."""
        return f"{self.task_index}:{self.rollout_index}"


@dataclass(frozen=True, slots=True)
class ScoredRollout:
    """A rollout that ran to the verifier. ``verified`` is the verify response: the task's
    fields, ``response`` (with any token-level fields the model server attached) and metrics."""

    task_index: int
    rollout_index: int
    reward: float
    attempts: int
    duration_s: float
    verified: dict[str, Any]
    integrity: Integrity | None = None
    """Its integrity verdict (``tagged``); None until the recorder has taken it."""
    ok: Literal[True] = field(default=True, init=False)

    @property
    def masked(self) -> bool:
        """Its reward is no measurement: the verify response asks for it to be masked
        (``mask_sample``), or the collector masked it for its integrity verdict (see the module
        docstring)."""
        return is_masked(self.verified) or (self.integrity is not None and self.integrity.masked)

    @property
    def response(self) -> dict[str, Any]:
        """The final Responses API response object of the rollout."""
        response = self.verified.get("response")
        return response if isinstance(response, dict) else {}

    @property
    def policy_versions(self) -> tuple[int | None, ...]:
        """The policy version each model call of the rollout ran under, in call order (None
        where the model server did not say): read from ``response["rollgym_upstream"]``
        (``rollgym.server.versions.rollout_versions``), with or without token data. Empty
        when the response records no model call."""
        return rollout_versions(self.response)

    @property
    def metrics(self) -> dict[str, float]:
        """The verifier's other numeric top-level fields (DESIGN.md: they are metrics)."""
        return {
            k: float(v)
            for k, v in self.verified.items()
            if k != "reward"
            and k not in INDEX_FIELDS
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
        }

    def to_json(self, extra: dict[str, Any] | None = None) -> bytes:
        """This record as one line of ``rollouts.jsonl`` (without the newline), its indices in
        both spellings (``wire.INDEX_FIELDS``). ``_ng_task_index`` is the task row's, which the
        verify response echoes (an input file may carry its own); else the task index.
        ``extra``: fields the run adds (its cost, its environment's fingerprint)."""
        ng_task = self.verified.get(NG_TASK_INDEX)
        if not isinstance(ng_task, int) or isinstance(ng_task, bool):
            ng_task = self.task_index
        line = {
            **self.verified,
            "task_index": self.task_index,
            "rollout_index": self.rollout_index,
            NG_TASK_INDEX: ng_task,
            NG_ROLLOUT_INDEX: self.rollout_index,
            "reward": self.reward,
            "attempts": self.attempts,
            "duration_s": round(self.duration_s, 4),
            "finished_at": round(time.time(), 3),
        }
        if self.integrity is not None:
            line[FIELD] = self.integrity.to_dict()
            if self.integrity.masked:
                line[MASK_SAMPLE] = True
        if extra:
            line.update(extra)
        return orjson.dumps(line)


@dataclass(frozen=True, slots=True)
class FailedRollout:
    """A rollout that could not finish: the typed error, and how many times it was tried.
    Never a reward of 0."""

    task_index: int
    rollout_index: int
    error: RollgymError
    attempts: int
    duration_s: float
    fields: dict[str, Any] | None = None
    """What its row's dialect adds to its line (``Exchange.fields``)."""
    cost: dict[str, Any] | None = None
    """What it spent before it failed (a ``rollgym_cost``: its agent's, on its error answer,
    or a scored rollout's own when it is discarded as one); None: not known (never free)."""
    ok: Literal[False] = field(default=False, init=False)

    @property
    def retryable(self) -> bool:
        return self.error.retryable

    def to_json(self, extra: dict[str, Any] | None = None) -> bytes:
        """This record as one line of ``failures.jsonl``: indices (in both spellings, as in
        ``rollouts.jsonl``), attempts, the error (``RollgymError.to_record``), the fields
        its row's dialect adds and ``extra`` (what the run adds)."""
        return orjson.dumps(
            {
                "task_index": self.task_index,
                "rollout_index": self.rollout_index,
                NG_TASK_INDEX: self.task_index,
                NG_ROLLOUT_INDEX: self.rollout_index,
                "attempts": self.attempts,
                "duration_s": round(self.duration_s, 4),
                "finished_at": round(time.time(), 3),
                "error": self.error.to_record(),
                **(self.fields or {}),
                **(extra or {}),
            }
        )


RolloutRecord = ScoredRollout | FailedRollout


def tagged(record: RolloutRecord, mask_exploits: bool = False) -> RolloutRecord:
    """``record`` with its integrity verdict (``rollgym.audit.scan``), masked when it is an
    exploit and ``mask_exploits`` says so. A failure has no reward to judge; a record already
    tagged is left as it is."""
    if isinstance(record, FailedRollout) or record.integrity is not None:
        return record
    found = scan(record.verified, record.reward)
    if mask_exploits and found.verdict == "exploit":
        found = dataclasses.replace(found, masked=True)
    return dataclasses.replace(record, integrity=found)


def checked(record: RolloutRecord) -> RolloutRecord:
    """``record``, or the failure it is: a scored rollout whose ``mask_sample`` is no boolean
    becomes a ``FailedRollout`` with the ``ProtocolError`` that says so."""
    if isinstance(record, FailedRollout):
        return record
    try:
        mask_sample(record.verified)
    except ProtocolError as err:
        return FailedRollout(
            record.task_index, record.rollout_index, err, record.attempts, record.duration_s,
            cost=spent_by(record),
        )  # fmt: skip
    return record


def spent_by(record: ScoredRollout) -> dict[str, Any] | None:
    """The ``rollgym_cost`` a scored rollout carries, for the failure it is turned into."""
    cost = record.verified.get(COST_FIELD)
    return cost if isinstance(cost, dict) else None
