"""What a rollout cost, read from its record: the ``rollgym_cost`` field of its line.

Everything here is already on the record, measured where it happened:

- model calls and their tokens: the agent's ``rollgym_timing.tokens`` (one ``[input, output]``
  per call, from the upstream's ``usage`` or counted from token ids:
  ``rollgym.server.usage``); for an agent that is not rollgym's, the response's summed
  ``usage``;
- model, environment (seed and tools) and verifier seconds: ``rollgym_timing``'s hops;
- judge calls and their tokens: the verify response's ``judge_calls``, ``judge_input_tokens``,
  ``judge_output_tokens`` and ``judge_model`` (``rollgym.envs.judge``);
- sandbox seconds: the verify response's ``sandbox_s`` (``rollgym.envs.code``);
- retries inside the rollout (``rollgym_timing.retries``) and the rollout's attempts.

A failed rollout's line says its attempts and wall seconds; its tokens are not known to the
collector (``metered: false``), and the ledger says how many such rollouts it could not meter
rather than count them as free. With a price table (``collect.prices``) each line carries its
``money``.
"""

from __future__ import annotations

from typing import Any

from rollgym.collect.records import RolloutRecord, ScoredRollout
from rollgym.config import ModelPrice, PriceTable
from rollgym.server.agent import TIMING_FIELD
from rollgym.server.usage import usage_tokens
from rollgym.wire import UPSTREAM_KEY

_ENV_HOPS = ("seed", "tool")


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


def _seconds(timing: dict[str, Any], hop: str) -> float:
    spent = timing.get(hop)
    return float(sum(spent)) if isinstance(spent, list) else 0.0


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


def rollout_cost(record: RolloutRecord, prices: PriceTable | None = None) -> dict[str, Any]:
    """The ``rollgym_cost`` of ``record``'s line (see the module docstring). Zero and absent
    parts are left out: the field stays small on every line."""
    if not isinstance(record, ScoredRollout):
        return {"attempts": record.attempts, "wall_s": round(record.duration_s, 4),
                "metered": False}  # fmt: skip
    verified = record.verified
    timing = verified.get(TIMING_FIELD)
    timing = timing if isinstance(timing, dict) else {}
    cost: dict[str, Any] = {"attempts": record.attempts}
    calls = timing.get("tokens")
    tokens_in = tokens_out = 0
    if isinstance(calls, list):
        unmetered = 0
        for call in calls:
            if isinstance(call, list) and len(call) == 2:
                tokens_in += int(call[0])
                tokens_out += int(call[1])
            else:
                unmetered += 1
        cost["calls"] = len(calls)
        if unmetered:
            cost["unmetered_calls"] = unmetered
    else:  # an agent that is not rollgym's: the response's usage, summed over its calls
        response = record.response
        summed = usage_tokens(response.get("usage"))
        upstream = response.get(UPSTREAM_KEY)
        cost["calls"] = len(upstream) if isinstance(upstream, list) else 1
        if summed is None:
            cost["metered"] = False
        else:
            tokens_in, tokens_out = summed
    cost["input_tokens"], cost["output_tokens"] = tokens_in, tokens_out
    model = record.response.get("model")
    if isinstance(model, str):
        cost["model"] = model
    spent = money(price_of(prices, model), tokens_in, tokens_out)
    unpriced = tokens_in + tokens_out if spent is None else 0
    for name, hops in (("model_s", ("model",)), ("env_s", _ENV_HOPS), ("verify_s", ("verify",))):
        took = sum(_seconds(timing, hop) for hop in hops)
        if took:
            cost[name] = round(took, 4)
    judge_calls = _number(verified.get("judge_calls"))
    if judge_calls:
        cost["judge_calls"] = int(judge_calls)
        judge_in = _number(verified.get("judge_input_tokens"))
        judge_out = _number(verified.get("judge_output_tokens"))
        if judge_in is None or judge_out is None:
            cost["judge_metered"] = False
        else:
            cost["judge_input_tokens"], cost["judge_output_tokens"] = int(judge_in), int(judge_out)
            judge_model = verified.get("judge_model")
            if isinstance(judge_model, str):
                cost["judge_model"] = judge_model
            judged = money(price_of(prices, judge_model), int(judge_in), int(judge_out))
            if judged is None:
                unpriced += int(judge_in + judge_out)
            else:
                spent = (spent or 0.0) + judged
    sandbox = _number(verified.get("sandbox_s"))
    if sandbox:
        cost["sandbox_s"] = round(sandbox, 4)
    retries = timing.get("retries")
    if isinstance(retries, dict):
        hop_retries = sum(n for n in retries.values() if isinstance(n, int))
        if hop_retries:
            cost["retries"] = hop_retries
    if prices is not None:
        cost["money"] = round(spent or 0.0, 8)
        if unpriced:
            cost["unpriced_tokens"] = unpriced
    return cost


def tokens_of(cost: dict[str, Any]) -> int:
    """Every token a rollout's ``rollgym_cost`` counts: model and judge, input and output."""
    return sum(int(cost.get(k, 0)) for k in _TOKEN_KEYS)


_TOKEN_KEYS = ("input_tokens", "output_tokens", "judge_input_tokens", "judge_output_tokens")
