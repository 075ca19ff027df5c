"""Groups that carry no learning signal: tasks whose scored rollouts all got the same reward.

GRPO (and every group-relative method) trains on a rollout's reward minus its group's mean, over
the group's spread: a group whose rewards are all equal (all 0, all 1, all 0.5) has every
advantage 0 and gives no gradient. Here a **group** is the scored rollouts of one
``task_index`` (its repeats); fewer than 2 make no group and are not judged. Failures are not
scored (a failure is never a reward of 0) and a masked rollout is no measurement: neither
joins a group. Rewards are equal when they are the same number (the group's spread is then
exactly 0).

Each group is dated by the ``finished_at`` of its last rollout (when a trainer would have it
whole), so its time window is the one ``failure_bursts`` uses. Memory is a few bytes per task
(flat arrays for a run's dense indices), never the records.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rollgym.collect.layout import LedgerLine
from rollgym.health.checks import EXAMPLES, Example
from rollgym.health.environments import Environments
from rollgym.health.slots import Slots
from rollgym.protocol import is_masked

MIN_GROUP = 2
"""Scored rollouts a task needs to be a group (one reward has no spread to judge)."""
MIN_ENV_GROUPS = 5
"""Groups an environment needs to be judged on its own (else only in the whole run)."""
VALUES_KEPT = 10
"""Distinct shared rewards counted in ``detail.by_reward``; the rest are ``other``."""
TIMELINE_LIMIT = 500
"""Windows kept in ``detail.timeline`` (the first ones)."""


class RewardGroups:
    """Per task: scored rollouts, the first reward, whether every reward so far equals it, the
    last finish time and the environment (an index into ``labels``)."""

    def __init__(self, slots: Slots, window_s: float, environments: Environments) -> None:
        self.window_s = window_s
        self._slots = slots
        self._environments = environments
        self._dense = slots.dense
        width = slots.tasks if slots.dense else 0
        self._n = array("l", bytes(8 * width))
        self._first = array("d", bytes(8 * width))
        self._equal = bytearray(b"\x01" * width)
        self._last = array("d", [-math.inf]) * width
        self._env = array("H", bytes(2 * width))
        self._sparse: dict[int, list[Any]] = {}
        self.labels: list[str] = []
        self._label_ids: dict[str, int] = {}

    def rollout(self, line: LedgerLine) -> None:
        """Count one record of rollouts.jsonl: an unmasked one of a row of tasks.jsonl."""
        rec = line.record
        if self._slots.expected(line.key) and not is_masked(rec):
            environment = self._environments.of(rec)
            self.add(line.key[0], rec.get("reward"), rec.get("finished_at"), environment)

    def _label(self, name: str) -> int:
        got = self._label_ids.get(name)
        if got is None:
            got = self._label_ids[name] = len(self.labels)
            self.labels.append(name)
        return got

    def add(self, task: int, reward: Any, finished_at: Any, environment: str) -> None:
        """Count one scored, unmasked rollout of ``task`` (a reward that is no finite number
        is no measurement: left out)."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            return
        reward = float(reward)
        if not math.isfinite(reward):
            return
        at = -math.inf  # no usable finish time: in no window
        if isinstance(finished_at, (int, float)) and not isinstance(finished_at, bool):
            at = float(finished_at) if math.isfinite(finished_at) else at
        if not self._dense:
            entry = self._sparse.get(task)
            if entry is None:
                self._sparse[task] = [1, reward, True, at, self._label(environment)]
            else:
                entry[0] += 1
                entry[2] = entry[2] and reward == entry[1]
                entry[3] = max(entry[3], at)
            return
        if not self._n[task]:
            self._first[task] = reward
            self._env[task] = self._label(environment)
        elif reward != self._first[task]:
            self._equal[task] = 0
        self._n[task] += 1
        if at > self._last[task]:
            self._last[task] = at

    def _groups(self) -> Iterator[tuple[int, int, float, bool, float, int]]:
        """(task, rollouts, first reward, all equal, last finish, environment index)."""
        if not self._dense:
            for task in sorted(self._sparse):
                n, first, equal, at, env = self._sparse[task]
                yield task, n, first, equal, at, env
            return
        for task, n in enumerate(self._n):
            if n:
                yield (task, n, self._first[task], bool(self._equal[task]), self._last[task],
                       self._env[task])  # fmt: skip

    def judged(self) -> tuple[int, int, list[Example], dict[str, Any]]:
        """(groups without signal, groups, first examples, detail) of the worst of the whole
        run and each environment with ``MIN_ENV_GROUPS`` groups or more."""
        flat, groups = 0, 0
        by_env: dict[int, list[int]] = {}  # environment -> [flat, groups]
        by_reward: Counter[str] = Counter()
        windows: dict[int, list[int]] = {}  # window -> [flat, groups]
        examples: list[Example] = []
        for task, n, first, equal, at, env in self._groups():
            if n < MIN_GROUP:
                continue
            groups += 1
            counts = by_env.setdefault(env, [0, 0])
            counts[1] += 1
            window = None
            if at > -math.inf:
                window = windows.setdefault(int(at // self.window_s), [0, 0])
            if window is not None:
                window[1] += 1
            if not equal:
                continue
            flat += 1
            counts[0] += 1
            if window is not None:
                window[0] += 1
            shown = f"{first:g}"
            by_reward[shown if shown in by_reward or len(by_reward) < VALUES_KEPT else "other"] += 1
            if len(examples) < EXAMPLES:
                examples.append(
                    Example(None, None, task, None, f"all {n} rewards are {shown}: no gradient")
                )
        named = sorted((self.labels[env], f, g) for env, (f, g) in by_env.items())
        environments = {
            name: {"no_signal": f, "groups": g, "share": round(f / g, 4)} for name, f, g in named
        }
        # The verdict is the whole run's share, or a worse one of an environment big enough to
        # be judged alone: a dead environment is not hidden by a lively one beside it.
        worst, count, of = "all", flat, groups
        if len(named) > 1:
            for name, f, g in named:
                if g >= MIN_ENV_GROUPS and f * of > count * g:
                    worst, count, of = name, f, g
        detail: dict[str, Any] = {
            "min_group": MIN_GROUP,
            "no_signal": flat,
            "groups": groups,
            "share": round(flat / groups, 4) if groups else None,
            "judged": worst,
            "min_environment_groups": MIN_ENV_GROUPS,
            "by_environment": environments,
            "by_reward": dict(by_reward.most_common()),
            "window_s": self.window_s,
            "timeline": [
                [w * self.window_s, f, g] for w, (f, g) in sorted(windows.items())[:TIMELINE_LIMIT]
            ],
            "timeline_columns": ["window_start", "no_signal", "groups"],
        }
        return count, of, examples, detail
