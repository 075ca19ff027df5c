"""The run's cost ledger (``cost.json``, and the ``cost`` section of ``metrics.json``).

Read from the run's files, every session's records counted: each line's ``rollgym_cost``
(``rollgym.collect.cost``). Every rollout is either a **useful** trained sample (scored, not
masked, in a group that carries a learning signal) or **wasted**, attributed to exactly one
cause, in this order:

- ``failed``: a failed rollout (``failures.jsonl``);
- ``retried``: an earlier failed attempt of a rollout that ran again (``failures.history.jsonl``);
- ``stale``: a rollout discarded as stale (``stale.jsonl``: the streaming trainer API's);
- ``masked``: a scored rollout whose reward is no measurement (``mask_sample``, an exploit
  masked);
- ``no_signal``: a scored rollout of a task whose repeats all got the same reward (with
  ``repeats`` > 1: a group with no learning signal under GRPO-style training).

So ``useful`` plus every cause adds up to the run's totals. Failed, retried and stale lines
carry no token counts (the collector never saw the rollout's calls): they are counted as
rollouts, attempts and seconds, and as ``unmetered`` (said, never read as free). Retries inside
rollouts (a model or tool call tried again) and rollouts abandoned at a budget are counted
apart.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from rollgym.collect.cost import tokens_of
from rollgym.collect.layout import RunDir, read_ledger
from rollgym.config import PriceTable
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

    def add(self, cost: dict[str, Any], attempts: int, wall_s: float) -> None:
        """One rollout: its cost, attempts and (failed: its wall) seconds."""
        self.rollouts += 1
        self.attempts += attempts
        self.tokens += tokens_of(cost)
        self.money += float(cost.get("money", 0.0))
        self.seconds += sum(float(cost.get(k, 0.0)) for k in ("model_s", "env_s", "verify_s"))
        self.seconds += wall_s
        self.sandbox_s += float(cost.get("sandbox_s", 0.0))
        if cost.get("metered") is False or cost.get("unmetered_calls"):
            self.unmetered += 1

    def to_dict(self, priced: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollouts": self.rollouts,
            "attempts": self.attempts,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "sandbox_s": round(self.sandbox_s, 3),
            "unmetered": self.unmetered,
        }
        if priced:
            out["money"] = round(self.money, 6)
        return out


class Totals:
    """The sums over every record of a run (``cost.json``'s ``totals``)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)

    def add(self, cost: dict[str, Any], wall_s: float = 0.0) -> None:
        sums = self.sums
        sums["wall_s"] += wall_s
        for key, value in cost.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] += value

    def to_dict(self) -> dict[str, Any]:
        s = self.sums
        return {
            "model_calls": int(s["calls"]),
            "input_tokens": int(s["input_tokens"]),
            "output_tokens": int(s["output_tokens"]),
            "judge_calls": int(s["judge_calls"]),
            "judge_input_tokens": int(s["judge_input_tokens"]),
            "judge_output_tokens": int(s["judge_output_tokens"]),
            "tokens": int(
                s["input_tokens"]
                + s["output_tokens"]
                + s["judge_input_tokens"]
                + s["judge_output_tokens"]
            ),
            "model_seconds": round(s["model_s"], 3),
            "environment_seconds": round(s["env_s"], 3),
            "verifier_seconds": round(s["verify_s"], 3),
            "sandbox_seconds": round(s["sandbox_s"], 3),
            "failed_seconds": round(s["wall_s"], 3),
            "retries_in_rollouts": int(s["retries"]),
            "unpriced_tokens": int(s["unpriced_tokens"]),
        }


def cost_ledger(
    out_dir: Path, repeats: int, prices: PriceTable | None, abandoned: int = 0
) -> dict[str, Any]:
    """The ledger of the run in ``out_dir`` (see the module docstring); ``abandoned``: rollouts
    in flight cancelled at a budget this session (unrecorded: ``--resume`` runs them)."""
    files = RunDir(out_dir)
    priced = prices is not None
    totals = Totals()
    useful = Tally()
    wasted = {cause: Tally() for cause in CAUSES}
    extra_attempts = 0
    # Scored rollouts wait for their group: whether it has a signal is known at the end.
    groups: dict[int, list[tuple[float | None, dict[str, Any], bool, int]]] = defaultdict(list)
    for got in read_ledger(files.rollouts):
        rec = got.record
        cost, attempts = _cost(rec), _attempts(rec)
        totals.add(cost)
        extra_attempts += attempts - 1
        masked = rec.get(MASK_SAMPLE) is True
        reward = rec.get("reward")
        reward = float(reward) if isinstance(reward, (int, float)) else None
        groups[rec["task_index"]].append((reward, cost, masked, attempts))
    for cause, path in (("failed", files.failures), ("retried", files.failures_history),
                        ("stale", files.stale)):  # fmt: skip
        for got in read_ledger(path):
            rec = got.record
            cost, wall = _cost(rec), rec.get("duration_s")
            wall = float(wall) if isinstance(wall, (int, float)) else 0.0
            totals.add(cost, wall)
            wasted[cause].add(cost, _attempts(rec), wall)
    for members in groups.values():
        measured = {reward for reward, _, masked, _ in members if not masked}
        no_signal = repeats > 1 and len(measured) == 1 and len(members) == repeats
        for _, cost, masked, attempts in members:
            tally = useful
            if masked:
                tally = wasted["masked"]
            elif no_signal:
                tally = wasted["no_signal"]
            tally.add(cost, attempts, 0.0)
    summed = totals.to_dict()
    rollouts = useful.rollouts + sum(t.rollouts for t in wasted.values())
    spent = useful.money + sum(t.money for t in wasted.values())
    ledger: dict[str, Any] = {
        "prices": None if prices is None else {
            "date": prices.date.isoformat(), "currency": prices.currency,
        },
        "rollouts": rollouts,
        "totals": summed,
        "useful": useful.to_dict(priced),
        "wasted": {cause: tally.to_dict(priced) for cause, tally in wasted.items()},
        "rollout_retries": extra_attempts,
        "abandoned_in_flight": abandoned,
        "per_rollout": _per(rollouts, summed["tokens"], spent if priced else None),
        "per_useful_sample": _per(useful.rollouts, summed["tokens"], spent if priced else None),
    }  # fmt: skip
    if priced:
        ledger["money"] = round(spent, 6)
    return ledger


def _cost(record: dict[str, Any]) -> dict[str, Any]:
    cost = record.get(COST_FIELD)
    # A line from before costs were recorded (or another writer's): not metered.
    return cost if isinstance(cost, dict) else {"metered": False}


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
    """The summary's cost line, from ``metrics.json``'s ``cost`` (``cost.json``)."""
    totals, per, useful = cost["totals"], cost["per_rollout"], cost["per_useful_sample"]
    said = f"{totals['tokens']:,} tokens ({totals['model_calls']} model calls"
    if totals["judge_calls"]:
        said += f", {totals['judge_calls']} judge calls"
    said += ")"
    if totals["sandbox_seconds"]:
        said += f", {totals['sandbox_seconds']:.1f} sandbox s"
    prices = cost.get("prices")
    if prices is not None:
        said += f", {cost['money']:.4f} {prices['currency']} (prices of {prices['date']})"
    if per.get("tokens") is not None:
        said += f"; per rollout {per['tokens']:,.0f} tokens"
        if per.get("money") is not None:
            said += f" {per['money']:.6f}"
    if useful.get("tokens") is not None:
        said += f"; per useful sample {useful['tokens']:,.0f} tokens"
        if useful.get("money") is not None:
            said += f" {useful['money']:.6f}"
    return said
