"""``/aggregate_metrics`` in NeMo Gym's shapes, with the baseline statistics it computes.

A collector, after a run, posts ``{"verify_responses": [...]}`` to each agent (which
forwards it to its resources server): the verify responses without ``response`` (but with
``response.usage``) and ``responses_create_params``, each carrying ``_ng_task_index``,
``_ng_rollout_index`` and ``reward``. The answer is ``{"group_level_metrics": [...],
"agent_metrics": {...}, "key_metrics": {...}}``:

- ``agent_metrics``: ``mean/``, ``max/``, ``min/``, ``median/``, ``std/`` of every numeric field
  over all rollouts (booleans count as 0/1, ``response.usage``'s counts included), plus the
  environment's own metrics (``ResourcesServer.aggregate_metrics``);
- ``group_level_metrics``: the same statistics per task (by ``_ng_task_index``, in order), with
  ``num_rollouts`` and ``rollout_infos`` (no ``sample``: it would mean nothing);
- ``key_metrics``: the environment's own metrics when it has any, else every ``mean/`` entry.

Masked rows (a top-level ``mask_sample: true``: the reward is no measurement) are left out of
every statistic and of ``group_level_metrics``, and ``mask_sample`` is never a metric. When
something is masked, both ``agent_metrics`` and ``key_metrics`` add four coverage keys
(``coverage/measured_rollouts``, ``coverage/masked_rollouts``, ``coverage/measured_tasks``,
``coverage/fully_masked_tasks``); when nothing is, they are left out. When everything is
masked, both hold the coverage keys only and there are no group metrics. The environment's own
metrics are its to compute: pass it ``measured(verify_responses)``. A ``mask_sample`` that is no
boolean is refused (422). Only the top-level flag is read (the collector writes a verify
response's flag there, wherever the environment put it).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rollgym.errors import InvalidRequest
from rollgym.wire import INDEX_FIELDS, MASK_SAMPLE, NG_ROLLOUT_INDEX, NG_TASK_INDEX

_STATS = ("mean", "max", "min", "median", "std")


class AggregateMetricsRequest(BaseModel):
    """The body of ``POST /aggregate_metrics``."""

    model_config = ConfigDict(extra="ignore")
    verify_responses: list[dict[str, Any]]


class AggregateMetrics(BaseModel):
    """The answer of ``POST /aggregate_metrics``."""

    model_config = ConfigDict(extra="ignore")
    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)


def aggregate(
    verify_responses: list[dict[str, Any]], environment: dict[str, Any]
) -> AggregateMetrics:
    """The answer for ``verify_responses``, with the ``environment``'s own metrics."""
    if not verify_responses:
        return AggregateMetrics(agent_metrics=dict(environment), key_metrics=dict(environment))
    rows, masked = split_masked(verify_responses)
    coverage = _coverage(rows, masked)
    if not rows:
        # Every rollout masked: statistics over nothing would invent numbers.
        return AggregateMetrics(agent_metrics=dict(coverage), key_metrics=dict(coverage))
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for vr in rows:
        groups[_index(vr, NG_TASK_INDEX, "task_index")].append(vr)
    group_level = []
    for task in sorted(groups):
        rollouts = groups[task]
        infos = sorted((_rollout_info(vr) for vr in rollouts), key=lambda i: i[NG_ROLLOUT_INDEX])
        group_level.append(
            {
                NG_TASK_INDEX: task,
                **describe([_numbers(vr) for vr in rollouts]),
                "num_rollouts": len(rollouts),
                "expected_num_rollouts": len(rollouts),
                "missing_num_rollouts": 0,
                "reward_profile_completion_pct": 100.0,
                "rollout_infos": infos,
            }
        )
    agent_metrics = {**describe([_numbers(vr) for vr in rows]), **environment, **coverage}
    key_metrics = (
        dict(environment)
        if environment
        else {k: v for k, v in agent_metrics.items() if k.startswith("mean/")}
    )
    key_metrics.update(coverage)
    return AggregateMetrics(
        group_level_metrics=group_level, agent_metrics=agent_metrics, key_metrics=key_metrics
    )


def split_masked(
    verify_responses: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(measured, masked) rows of ``verify_responses``; ``InvalidRequest`` (422) for a row whose
    ``mask_sample`` is no boolean."""
    measured: list[dict[str, Any]] = []
    masked: list[dict[str, Any]] = []
    for i, vr in enumerate(verify_responses):
        flag = vr.get(MASK_SAMPLE)
        if flag is not None and not isinstance(flag, bool):
            raise InvalidRequest(
                f"verify_responses[{i}]: verify response has {MASK_SAMPLE} {_shown(flag)}, "
                "which is no boolean (true: the reward is no measurement; false or absent: it "
                "is one)",
                status=422,
            )
        (masked if flag else measured).append(vr)
    return measured, masked


def _shown(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()[:100]
    except TypeError:
        return type(value).__name__


def measured(verify_responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``verify_responses`` whose reward is a measurement (not masked)."""
    return split_masked(verify_responses)[0]


def _coverage(rows: list[dict[str, Any]], masked: list[dict[str, Any]]) -> dict[str, int]:
    """The coverage keys, only when something is masked (a run that masks nothing answers
    no coverage)."""
    if not masked:
        return {}
    measured_tasks = {_index(vr, NG_TASK_INDEX, "task_index") for vr in rows}
    all_tasks = measured_tasks | {_index(vr, NG_TASK_INDEX, "task_index") for vr in masked}
    return {
        "coverage/measured_rollouts": len(rows),
        "coverage/masked_rollouts": len(masked),
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len(all_tasks - measured_tasks),
    }


def describe(rows: list[dict[str, float]]) -> dict[str, float]:
    """``stat/field`` for each numeric field of ``rows`` (a field missing from a row is left
    out of that field's statistics, as pandas skips NaN). ``std`` is the sample standard
    deviation; where no field has two values it is 0 for the fields every row has."""
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    stds = {k: statistics.stdev(v) for k, v in columns.items() if len(v) > 1}
    if not stds:
        stds = {k: 0.0 for k, v in columns.items() if len(v) == len(rows)}
    stats: dict[str, dict[str, float]] = {
        "mean": {k: math.fsum(v) / len(v) for k, v in columns.items()},
        "max": {k: max(v) for k, v in columns.items()},
        "min": {k: min(v) for k, v in columns.items()},
        "median": {k: float(statistics.median(v)) for k, v in columns.items()},
        "std": stds,
    }
    return {f"{stat}/{key}": value for stat in _STATS for key, value in stats[stat].items()}


def _usage(vr: dict[str, Any]) -> dict[str, Any]:
    response = vr.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def _numbers(vr: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of one verify response, ``response.usage``'s counts included."""
    out: dict[str, float] = {}
    for key, value in {**vr, **_usage(vr)}.items():
        if key in INDEX_FIELDS or key == MASK_SAMPLE:
            continue  # indices and the mask flag are no measurements
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float)) and not math.isnan(value):
            out[key] = value
    return out


def _index(vr: dict[str, Any], *keys: str) -> int:
    # A rollout without an index counts as index 0.
    for key in keys:
        value = vr.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _rollout_info(vr: dict[str, Any]) -> dict[str, Any]:
    task = _index(vr, NG_TASK_INDEX, "task_index")
    rollout = _index(vr, NG_ROLLOUT_INDEX, "rollout_index")
    info: dict[str, Any] = {
        "rollout_id": f"{task}:{rollout}",
        NG_TASK_INDEX: task,
        NG_ROLLOUT_INDEX: rollout,
    }
    if "reward" in vr:
        info["reward"] = vr["reward"]
    info.update(_numbers(vr))
    return info
