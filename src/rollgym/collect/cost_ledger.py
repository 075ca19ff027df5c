"""The run's cost ledger (``cost.json``, and the ``cost`` section of ``metrics.json``).

Kept as the run's records are written, and folded from its files for the sessions before a
``--resume``: every session's records counted, each by its line's ``rollgym_cost``
(``rollgym.collect.cost``). Every rollout is either a **useful** trained sample (scored, not
masked, in a group that carries a learning signal) or **wasted**, attributed to exactly one
cause, in this order:

- ``failed``: a failed rollout (``failures.jsonl``, but for a stale one);
- ``retried``: an earlier failed attempt of a rollout that ran again (``failures.history.jsonl``,
  one rollout each), and the failed attempts of a rollout that scored after retries in the run
  (its line's ``rollgym_cost.retried``: their tokens, money, seconds and attempts, the rollout
  itself counted where it ended);
- ``stale``: a rollout discarded as stale (a ``stale_rollout`` failure; ``stale.jsonl``, the
  streaming trainer API's);
- ``masked``: a scored rollout whose reward is no measurement (``mask_sample``, an exploit
  masked);
- ``no_signal``: a scored rollout of a task whose repeats all got the same reward (with
  ``repeats`` > 1: a group with no learning signal under GRPO-style training).

So ``useful`` plus every cause adds up to the run's totals. Failed, retried and stale lines
carry what their agent said they spent (``rollgym.collect.cost``); where it said nothing they
are counted as rollouts, attempts and seconds, and as ``unmetered`` (said, never read as free).
Retries inside rollouts (a model or tool call tried again) and rollouts abandoned at a budget
are counted apart.
"""

from __future__ import annotations

from operator import add
from pathlib import Path
from typing import Any, cast

from rollgym.collect.cost import COUNTS, FAILED, RETRIED, Parts, parts
from rollgym.collect.failure_budget import is_stale
from rollgym.collect.layout import RunDir, read_ledger
from rollgym.config import PriceTable
from rollgym.errors import RollgymError
from rollgym.wire import COST_FIELD, MASK_SAMPLE

CAUSES = ("failed", "retried", "stale", "masked", "no_signal")


class Tally:
    """Rollouts, tokens, money and seconds of one share of a run."""

    __slots__ = ("attempts", "money", "rollouts", "sandbox_s", "seconds", "tokens", "unmetered")

    def __init__(self) -> None:
        self.rollouts = 0
        self.attempts = 0
        self.tokens = 0
        self.money = 0.0
        self.seconds = 0.0
        self.sandbox_s = 0.0
        self.unmetered = 0

    def add(self, p: Parts, attempts: int, wall_s: float) -> None:
        """One rollout: its cost's parts, attempts and (failed: its wall) seconds."""
        self.rollouts += 1
        self.attempts += attempts
        self.tokens += p[1] + p[2] + p[4] + p[5]
        self.money += p[12]
        self.seconds += p[6] + p[7] + p[8] + wall_s
        self.sandbox_s += p[9]
        self.unmetered += p[-1]

    def share(self, p: Parts, attempts: int) -> None:
        """The spend of a rollout's failed attempts, the rollout itself counted where it
        ended (``retried`` of a rollout that scored after retries in the run)."""
        self.attempts += attempts
        self.tokens += p[1] + p[2] + p[4] + p[5]
        self.money += p[12]
        self.seconds += p[6] + p[7] + p[8]
        self.sandbox_s += p[9]
        self.unmetered += p[-1]

    def merge(self, other: Tally) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self, priced: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollouts": self.rollouts,
            "attempts": self.attempts,
            "tokens": self.tokens,
            "seconds": _round(self.seconds, 3),
            "sandbox_s": _round(self.sandbox_s, 3),
            "unmetered": self.unmetered,
        }
        if priced:
            out["money"] = _round(self.money, 6)
        return out


class Totals:
    """The sums over every record of a run (``cost.json``'s ``totals``)."""

    def __init__(self) -> None:
        self.sums = [0.0] * COUNTS
        self.wall_s = 0.0

    def add(self, p: Parts, wall_s: float = 0.0) -> None:
        # map in C, not a Python loop: it runs once per record (zip stops at the sums' end).
        self.sums = list(map(add, self.sums, p))
        self.wall_s += wall_s

    def to_dict(self) -> dict[str, Any]:
        (calls, tin, tout, jcalls, jin, jout, model_s, env_s, verify_s, sandbox_s, retries,
         unpriced, _, failed, jfailed, unmetered, junmetered) = self.sums  # fmt: skip
        return {
            "model_calls": int(calls),
            "input_tokens": int(tin),
            "output_tokens": int(tout),
            "judge_calls": int(jcalls),
            "judge_input_tokens": int(jin),
            "judge_output_tokens": int(jout),
            "tokens": int(tin + tout + jin + jout),
            "model_seconds": _round(model_s, 3),
            "environment_seconds": _round(env_s, 3),
            "verifier_seconds": _round(verify_s, 3),
            "sandbox_seconds": _round(sandbox_s, 3),
            "failed_seconds": _round(self.wall_s, 3),
            "retries_in_rollouts": int(retries),
            "unpriced_tokens": int(unpriced),
            # Among the calls above: failed ones that may have been billed, and calls whose
            # tokens are not known (counted as calls, never as 0 tokens: ``unmetered``).
            "failed_model_calls": int(failed),
            "failed_judge_calls": int(jfailed),
            "unmetered_model_calls": int(unmetered),
            "unmetered_judge_calls": int(junmetered),
        }


class _Group:
    """One task's scored, unmasked rollouts: their rewards (two distinct are enough to know
    there is a signal) and their summed cost."""

    __slots__ = ("n", "rewards", "tally")

    def __init__(self) -> None:
        self.n = 0
        self.rewards: set[float | None] = set()
        self.tally = Tally()


class CostLedger:
    """The ledger, kept as records are written (``RunSpend.stamp``: a few additions per
    record, nothing read back) and folded from the run's files for the sessions before
    (``load``, on ``--resume``). Memory grows with the tasks, not the rollouts."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        self.totals = Totals()
        self.masked = Tally()
        self.wasted = {cause: Tally() for cause in CAUSES if cause not in ("masked", "no_signal")}
        self.groups: dict[int, _Group] = {}
        self.masked_n = 0
        self.extra_attempts = 0

    def scored(
        self, task_index: int, reward: float | None, masked: bool, cost: dict[str, Any],
        attempts: int,
    ) -> None:  # fmt: skip
        """A scored rollout; ``TypeError`` (nothing counted) if its cost holds no numbers."""
        p = parts(cost)
        self.totals.add(p)
        self.extra_attempts += attempts - 1
        if (retried := cost.get(RETRIED)).__class__ is dict:
            # Its failed attempts' share is waste, under ``retried``; its own attempt's (the
            # whole less that share) is the sample's.
            r = parts(retried)
            tried = retried.get("attempts", 0)
            self.wasted["retried"].share(r, tried if tried.__class__ is int else 0)
            p = _less(p, r)
        if masked:
            self.masked.add(p, attempts, 0.0)
            return
        group = self.groups.get(task_index)
        if group is None:
            group = self.groups[task_index] = _Group()
        group.n += 1
        if len(group.rewards) < 2:
            group.rewards.add(reward)
        group.tally.add(p, attempts, 0.0)

    def unscored(self, cause: str, cost: dict[str, Any], attempts: int, wall_s: float) -> None:
        """A failed (``failed``, ``stale``) or retried rollout."""
        p = parts(cost)
        self.totals.add(p, wall_s)
        self.wasted[cause].add(p, attempts, wall_s)

    def load(self, out_dir: Path) -> CostLedger:
        """Fold in every record of the run in ``out_dir`` (see the module docstring)."""
        files = RunDir(out_dir)
        for got in read_ledger(files.rollouts):
            rec = got.record
            reward = rec.get("reward")
            reward = float(reward) if isinstance(reward, (int, float)) else None
            masked = rec.get(MASK_SAMPLE) is True
            self.scored(rec["task_index"], reward, masked, line_cost(rec), _attempts(rec))
        for cause, path in (("failed", files.failures), ("retried", files.failures_history),
                            ("stale", files.stale)):  # fmt: skip
            for got in read_ledger(path):
                rec = got.record
                wall = rec.get("duration_s")
                wall = float(wall) if isinstance(wall, (int, float)) else 0.0
                why = "stale" if cause == "failed" and _stale(rec) else cause
                self.unscored(why, line_cost(rec), _attempts(rec), wall)
        return self

    def to_dict(self, prices: PriceTable | None, abandoned: int = 0) -> dict[str, Any]:
        """``cost.json``; ``abandoned``: rollouts in flight cancelled at a budget this session
        (unrecorded: ``--resume`` runs them)."""
        priced = prices is not None
        useful, no_signal = Tally(), Tally()
        for group in self.groups.values():
            flat = self.repeats > 1 and group.n == self.repeats and len(group.rewards) == 1
            (no_signal if flat else useful).merge(group.tally)
        wasted = {**self.wasted, "masked": self.masked, "no_signal": no_signal}
        summed = self.totals.to_dict()
        rollouts = useful.rollouts + sum(t.rollouts for t in wasted.values())
        spent = round(useful.money + sum(t.money for t in wasted.values()), _SNAP)
        ledger: dict[str, Any] = {
            "prices": None if prices is None else {
                "date": prices.date.isoformat(), "currency": prices.currency,
            },
            "rollouts": rollouts,
            "totals": summed,
            "useful": useful.to_dict(priced),
            "wasted": {cause: wasted[cause].to_dict(priced) for cause in CAUSES},
            "rollout_retries": self.extra_attempts,
            "abandoned_in_flight": abandoned,
            "per_rollout": _per(rollouts, summed["tokens"], spent if priced else None),
            "per_useful_sample": _per(useful.rollouts, summed["tokens"],
                                      spent if priced else None),
        }  # fmt: skip
        if priced:
            ledger["money"] = _round(spent, 6)
        return ledger


_SNAP = 9
"""Decimals a sum is snapped to before it is rounded for ``cost.json`` (``_round``)."""


def _round(value: float, digits: int) -> float:
    """``value`` (a sum of seconds or money, each given to at most 8 decimals) rounded to
    ``digits``, the same whatever order it was summed in: a sum kept as records arrive and one
    read back from the files (``cost_ledger``) add the same numbers in other orders, and the
    float error of either decided a sum that falls on a rounding boundary (1.7745 s: 1.774 one
    way, 1.775 the other). Snapped to ``_SNAP`` decimals first, both are the same float."""
    return round(round(value, _SNAP), digits)


def _less(whole: Parts, share: Parts) -> Parts:
    """``whole``'s numbers less ``share``'s (its unmetered flag kept: said, never cleared)."""
    less = [a - b for a, b in zip(whole[:COUNTS], share[:COUNTS], strict=True)]
    return cast(Parts, (*less, whole[-1]))


def cost_ledger(
    out_dir: Path, repeats: int, prices: PriceTable | None, abandoned: int = 0
) -> dict[str, Any]:
    """The ledger of the run in ``out_dir``, read from its files (``rollgym report``, a run
    directory read after the fact)."""
    return CostLedger(repeats).load(out_dir).to_dict(prices, abandoned)


def _stale(record: dict[str, Any]) -> bool:
    """Whether a failure's line is a stale rollout's (``failure_budget.is_stale``)."""
    error = record.get("error")
    return isinstance(error, dict) and is_stale(RollgymError.from_dict(error))


def line_cost(record: dict[str, Any]) -> dict[str, Any]:
    """The ``rollgym_cost`` of a ledger line, or ``FAILED``'s when it has none that holds
    numbers."""
    cost = record.get(COST_FIELD)
    # A line from before costs were recorded, or another writer's: not metered.
    if not isinstance(cost, dict):
        return FAILED
    try:
        parts(cost)
    except TypeError:
        return FAILED
    return cost


def _attempts(record: dict[str, Any]) -> int:
    attempts = record.get("attempts")
    return attempts if isinstance(attempts, int) and attempts > 0 else 1


def _per(n: int, tokens: int, spent: float | None) -> dict[str, Any]:
    """The run's whole cost divided by ``n`` rollouts (None when there are none)."""
    if n == 0:
        return {"tokens": None, "money": None} if spent is not None else {"tokens": None}
    out: dict[str, Any] = {"tokens": round(tokens / n, 2)}
    if spent is not None:
        out["money"] = round(spent / n, 8)
    return out


def describe_cost(cost: dict[str, Any]) -> str:
    """A run summary's cost line, from ``cost.json``: ``25,170 tokens, 220 model calls; per
    rollout 242, per useful sample 370 tokens`` (with prices: in money)."""
    totals, per, useful = cost["totals"], cost["per_rollout"], cost["per_useful_sample"]
    said = f"{totals['tokens']:,} tokens, {totals['model_calls']} model calls"
    if failed := totals.get("failed_model_calls"):
        said += f" ({failed} failed)"
    if totals["judge_calls"]:
        said += f", {totals['judge_calls']} judge calls"
        if failed := totals.get("failed_judge_calls"):
            said += f" ({failed} failed)"
    if totals["sandbox_seconds"]:
        said += f", {totals['sandbox_seconds']:.1f} sandbox CPU s"
    prices = cost.get("prices")
    if prices is not None:
        currency = prices["currency"]
        said += f", {cost['money']:.4f} {currency} (prices of {prices['date']})"
        each = [f"per rollout {per['money']:.6f}" if per.get("money") is not None else "",
                f"per useful sample {useful['money']:.6f}"
                if useful.get("money") is not None else ""]  # fmt: skip
        unit = currency
    else:
        each = [f"per rollout {per['tokens']:,.0f}" if per.get("tokens") is not None else "",
                f"per useful sample {useful['tokens']:,.0f}"
                if useful.get("tokens") is not None else ""]  # fmt: skip
        unit = "tokens"
    shown = [e for e in each if e]
    return said + (f"; {', '.join(shown)} {unit}" if shown else "")
