"""The trainer-facing API: a batch of task rows in, one record per rollout out, grouped by task.

    client = RolloutClient("http://10.0.0.5:8000")          # the agent server (or its replicas)
    groups = client.collect_sync(rows, repeats=8)           # or: await client.collect(...)
    for group in groups:                                    # one per row, in input order
        rewards = group.rewards                             # measured rollouts only

Each record is a ``ScoredRollout`` (reward, the verified response, every field the verifier and
the model server attached) or a ``FailedRollout`` holding the typed ``RollgymError``. A failure
never cancels its siblings and is never a reward of 0.

A masked rollout (its verify response says ``mask_sample: true``: "this reward is no measurement",
e.g. the environment's checker crashed) is a ``ScoredRollout`` with ``masked`` true. For the group
it counts like a failure: it is in ``group.masked``, never in ``group.scored`` or ``group.rewards``,
and the group is not ``complete``; so a GRPO baseline over ``group.rewards`` never sees its
placeholder reward, and its loss should be zeroed as NeMo RL zeroes a masked sample's (``r.ok`` only
says it was recorded as a success: go through ``scored``, or check ``r.masked``, before reading
``r.reward``). A ``mask_sample`` that is no boolean fails the rollout (``ProtocolError``) instead of
being guessed. Records are plain frozen dataclasses: they pickle, so they cross a ``spawn`` process
or a Ray actor boundary (``ray.get``) unchanged.

Every rollout runs through the same core as ``rollgym run`` (``rollgym.collect.rollout``),
with the run's rules: an agent that does not answer fails the batch before anything is sent
(``LaunchError``); a rollout refused by an open circuit is held and re-sent; a batch whose
failures cross the failure budget is cancelled and raises ``RunAborted`` with the summary.
With ``strict=True`` the first failure raises its error instead and the batch's other rollouts
are cancelled. Raised from a Ray actor, the error reaches the driver as ``RayTaskError(<ours>)``,
which Ray makes an instance of our class too, every field readable (``except HTTPStatusError as
e: e.status, e.server, e.body``); ``plain_error(e)`` gives back the original error object.

``client.stream(rows, repeats=16)`` is the asynchronous form: groups in the order they finish,
with back-pressure, bounded staleness and pause/resume for weight updates (``RolloutStream``).
``PolicyControl`` pauses the model servers, and resumes them on new weights.
``BatchCost.of(groups, prices)`` says what a batch cost, per rollout and per useful trained
sample (``rollgym.trainer.cost``).

The modules: ``client`` (``RolloutClient``), ``group`` (``TaskGroup``), ``stream``
(``RolloutStream``; its parts: ``feed``, rows in and groups out, ``staleness``, the judge of a
rollout's policy versions, ``stream_ledger``, its run directory), ``policy_control`` and ``forks``
(continuations of a recorded rollout from its turn k, ``rollgym.replay``). None of
them imports Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from rollgym.trainer.cost import BatchCost
    from rollgym.trainer.feed import StreamStats
    from rollgym.trainer.forks import fork, fork_sync
    from rollgym.trainer.group import TaskGroup
    from rollgym.trainer.policy_control import PolicyControl
    from rollgym.trainer.stream import RolloutStream

# Imported on first use: a trainer that needs one name (``integrations.weights`` needs
# PolicyControl) must not load the whole API with it.
_HOMES = {
    "BatchCost": "rollgym.trainer.cost",
    "BatchOptions": "rollgym.trainer.client",
    "BudgetRules": "rollgym.collect.failure_budget",
    "DEFAULT_BUDGET": "rollgym.trainer.client",
    "FailedRollout": "rollgym.collect.records",
    "PolicyControl": "rollgym.trainer.policy_control",
    "RolloutClient": "rollgym.trainer.client",
    "RolloutRecord": "rollgym.collect.records",
    "RolloutStream": "rollgym.trainer.stream",
    "ScoredRollout": "rollgym.collect.records",
    "StreamStats": "rollgym.trainer.feed",
    "SyncStream": "rollgym.trainer.client",
    "TaskGroup": "rollgym.trainer.group",
    "collect_batch": "rollgym.trainer.client",
    "collect_batch_sync": "rollgym.trainer.client",
    "fork": "rollgym.trainer.forks",
    "fork_sync": "rollgym.trainer.forks",
    "plain_error": "rollgym.trainer.client",
}

__all__ = [
    "DEFAULT_BUDGET",
    "BatchCost",
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
    "fork",
    "fork_sync",
    "plain_error",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rollgym.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
