"""What a rollout cost: the ``rollgym_cost`` field of its line, and its money.

A rollout's cost is measured where it happened and summed by its agent
(``rollgym.server.usage.rollout_cost``, on the verify response beside ``rollgym_timing``): its
model calls and their tokens (from the upstream's ``usage``, or counted from token ids), its
model, environment and verifier seconds, its retries, its judge calls and their tokens, its
sandbox seconds. The collector does not compute it again (its hot path stays as it was): it
adds the money when the run has a price table (``collect.prices``), and computes a cost only
for an agent that is not rollgym's (the response's summed ``usage``).

A failed rollout's line carries what it spent before it failed where that is known: a rollgym
agent answers a failure with its ``rollgym_cost`` beside the error (its model calls' tokens and
its hops' seconds; ``spent_before`` takes it off the error, summed over the rollout's attempts),
and a rollout discarded after it scored (stale) keeps its own. Where it is not known (the agent
never answered: a timeout, a dead agent; a foreign agent) the line says ``{"metered": false}``
(its attempts and seconds are on the line already), and the ledger counts such rollouts apart
rather than as free.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from rollgym.collect.records import RolloutRecord, ScoredRollout
from rollgym.config import ModelPrice, PriceTable
from rollgym.errors import RollgymError
from rollgym.server.usage import MAX_COUNT, usage_tokens
from rollgym.wire import COST_FIELD, UPSTREAM_KEY

RETRIED = "retried"
"""The part of a scored rollout's cost its earlier failed attempts spent (``with_retried``)."""

FAILED: dict[str, Any] = {"metered": False}
"""The cost of a failed rollout's line (shared: never changed)."""

_TOKEN_KEYS = ("input_tokens", "output_tokens", "judge_input_tokens", "judge_output_tokens")


def price_of(prices: PriceTable | None, model: Any) -> ModelPrice | None:
    """The price of ``model`` (as its answers name it) in ``prices``; None: unpriced."""
    if prices is None:
        return None
    found = prices.models.get(model) if isinstance(model, str) else None
    return found if found is not None else prices.default


def money(price: ModelPrice | None, input_tokens: int, output_tokens: int) -> float | None:
    if price is None:
        return None
    return (input_tokens * price.input_per_1m + output_tokens * price.output_per_1m) / 1e6


def priced(cost: dict[str, Any], prices: PriceTable) -> dict[str, Any]:
    """``cost`` with its ``money`` (and ``unpriced_tokens``: those of a model the table does
    not price), a new dict."""
    spent = 0.0
    unpriced = 0
    for model, tokens_in, tokens_out in (
        (cost.get("model"), cost.get("input_tokens", 0), cost.get("output_tokens", 0)),
        (cost.get("judge_model"), cost.get("judge_input_tokens", 0),
         cost.get("judge_output_tokens", 0)),
    ):  # fmt: skip
        if not tokens_in and not tokens_out:
            continue
        got = money(price_of(prices, model), tokens_in, tokens_out)
        if got is None:
            unpriced += tokens_in + tokens_out
        else:
            spent += got
    out = {**cost, "money": round(spent, 8)}
    if unpriced:
        out["unpriced_tokens"] = unpriced
    if (share := cost.get(RETRIED)).__class__ is dict:
        out[RETRIED] = priced(share, prices)  # the ledger attributes its money too
    return out


def foreign_cost(record: ScoredRollout) -> dict[str, Any]:
    """The cost of a rollout whose agent is not rollgym's: its response's summed usage."""
    return response_cost(record.response)


def response_cost(response: dict[str, Any]) -> dict[str, Any]:
    """A cost from a final response's summed ``usage`` (``foreign_cost``)."""
    upstream = response.get(UPSTREAM_KEY)
    cost: dict[str, Any] = {"calls": len(upstream) if isinstance(upstream, list) else 1}
    summed = usage_tokens(response.get("usage"))
    if summed is None:
        cost["metered"] = False
        summed = (0, 0)
    cost["input_tokens"], cost["output_tokens"] = summed
    if isinstance(model := response.get("model"), str):
        cost["model"] = model
    return cost


def spent_before(err: RollgymError) -> tuple[RollgymError, dict[str, Any] | None]:
    """The failure ``err`` without the ``rollgym_cost`` its agent's error answer carried beside
    the error, and that cost (None: it carried none that holds numbers). Taken off the body so
    the record says it once, on the line's ``rollgym_cost``."""
    body = err.body
    if not body or '"rollgym_cost"' not in body or err.truncated:
        return err, None
    try:
        data = orjson.loads(body)
        cost = data.pop(COST_FIELD)
        parts(cost)
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return err, None  # not an answer a rollgym agent wrote: left as it came
    # Nothing left but the cost (a 0.7 failure's, ``rollgym.nemo_gym``): no body at all.
    return err.with_fields(body=orjson.dumps(data).decode() if data else None), cost


def summed(one: dict[str, Any] | None, two: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two attempts' costs as one (numbers added, the rest as the later one says)."""
    if one is None or two is None:
        return two if one is None else one
    out = {**one, **two}
    for key, value in one.items():
        other = two.get(key)
        if value.__class__ is int and other.__class__ is int:
            out[key] = value + other
        elif value.__class__ in (int, float) and other.__class__ in (int, float):
            out[key] = round(value + other, 4)
    return out


def with_retried(verified: dict[str, Any], spent: dict[str, Any], failed: int) -> None:
    """Carry what a rollout's ``failed`` earlier attempts in this run ``spent`` onto the cost
    of its scored one (``verified``'s ``rollgym_cost``, changed in place): the line's cost is
    then the whole rollout's (every attempt's numbers added; ``per_call`` stays the scored
    attempt's), and its ``retried`` part says the failed attempts' share, which the ledger
    counts under ``retried``, not under the sample's own cause."""
    own: Any = verified.get(COST_FIELD)
    try:
        parts(own)
    except (TypeError, AttributeError):  # an agent that is not rollgym's: its usage
        response = verified.get("response")
        own = response_cost(response if isinstance(response, dict) else {})
    whole = summed(spent, own)
    assert whole is not None  # both given
    whole[RETRIED] = {**spent, "attempts": failed}
    verified[COST_FIELD] = whole


def rollout_cost(record: RolloutRecord, prices: PriceTable | None = None) -> dict[str, Any]:
    """The ``rollgym_cost`` of ``record``'s line (see the module docstring): its agent's, or
    where it has none that holds numbers, its response's usage; a failure's what it spent, if
    known."""
    if not isinstance(record, ScoredRollout):
        spent: Any = record.cost
        try:
            parts(spent)  # None, or a cost no rollgym agent wrote: not known
        except (TypeError, AttributeError):
            return FAILED
        return spent if prices is None else priced(spent, prices)
    cost: Any = record.verified.get(COST_FIELD)
    try:
        parts(cost)
    except (TypeError, AttributeError):
        cost = foreign_cost(record)
    return cost if prices is None else priced(cost, prices)


Parts = tuple[
    int, int, int, int, int, int, float, float, float, float, int, int, float,
    int, int, int, int, bool,
]  # fmt: skip
"""One ``rollgym_cost`` read once: calls, input, output, judge calls, judge input, judge
output, model s, environment s, verifier s, sandbox s, retries, unpriced tokens, money, failed
calls, failed judge calls, unmetered calls, unmetered judge calls (``COUNTS`` numbers), and
whether any of it is unmetered."""

COUNTS = 17
"""How many of a ``Parts``' entries are numbers (the last says: unmetered)."""

MAX_PART = MAX_COUNT
"""The most any one count of one rollout's cost may say (about 10^12 tokens, calls or
seconds, as a rollgym agent takes them: ``rollgym.server.usage.MAX_COUNT``): a larger one is
no measurement, and sums of them would pass what a JSON file holds (an integer past 64 bits
fails ``cost.json``'s write)."""


def parts(cost: dict[str, Any]) -> Parts:
    """``cost``'s numbers; ``TypeError`` when one is no number, is negative, not finite or
    past ``MAX_PART`` (a cost no rollgym agent wrote: a foreign agent's, or one it passed on
    from its environment), its ``retried`` share's too, before anything is counted.
    Straight-line: it runs once per record."""
    g = cost.get
    got = (
        g("calls", 0) + 0, g("input_tokens", 0) + 0, g("output_tokens", 0) + 0,
        g("judge_calls", 0) + 0, g("judge_input_tokens", 0) + 0,
        g("judge_output_tokens", 0) + 0, g("model_s", 0.0) + 0.0, g("env_s", 0.0) + 0.0,
        g("verify_s", 0.0) + 0.0, g("sandbox_s", 0.0) + 0.0, g("retries", 0) + 0,
        g("unpriced_tokens", 0) + 0, g("money", 0.0) + 0.0,
        g("failed_calls", 0) + 0, g("judge_failed_calls", 0) + 0,
        g("unmetered_calls", 0) + 0, g("judge_unmetered_calls", 0) + 0,
        g("metered") is False or "unmetered_calls" in cost or "judge_unmetered_calls" in cost,
    )  # fmt: skip
    counts = got[:COUNTS]
    # Counts none negative whose sum is at most MAX_PART are each at most MAX_PART: two passes
    # in C instead of a loop (a NaN or infinite count makes the sum fail its range). Only a
    # cost past that, rare, is checked count by count.
    if not 0 <= sum(counts) <= MAX_PART or min(counts) < 0:
        for value in counts:
            if not 0 <= value <= MAX_PART:  # NaN too: it compares false
                raise TypeError(f"a cost count of {value!r} is no measurement")
    if (share := g(RETRIED)).__class__ is dict:
        parts(share)  # the ledger reads it after the whole: checked first
    return cast(Parts, got)


def tokens_of(cost: dict[str, Any]) -> int:
    """Every token a rollout's ``rollgym_cost`` counts: model and judge, input and output."""
    return sum(int(cost.get(k, 0)) for k in _TOKEN_KEYS)
