"""The tokens one model call used, read from its answer; what a whole rollout cost.

From the upstream's ``usage`` (a Responses API answer's ``input_tokens`` / ``output_tokens``, a
chat completion's ``prompt_tokens`` / ``completion_tokens``); where the answer has no usage,
counted from the token ids it carries (``prompt_token_ids`` / ``generation_token_ids`` on its
last output item, where ``return_token_ids`` puts them: ``rollgym.models.tokens``). None when it
says neither: the call is not metered, and the cost ledger says so rather than count it as 0.

``rollout_cost`` sums a rollout's calls, hops and verify response into its ``rollgym_cost``,
where they were measured: in its agent (``rollgym.server.agent``), off the collector's hot path.
"""

from __future__ import annotations

from typing import Any

from rollgym.wire import GENERATION_IDS, PROMPT_IDS

Tokens = tuple[int, int]
"""(input tokens, output tokens) of one model call."""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_tokens(usage: Any) -> Tokens | None:
    """(input, output) from a ``usage`` object of either API; None when it holds neither."""
    if not isinstance(usage, dict):
        return None
    got_in = _count(usage.get("input_tokens"))
    if got_in is None:
        got_in = _count(usage.get("prompt_tokens"))
    got_out = _count(usage.get("output_tokens"))
    if got_out is None:
        got_out = _count(usage.get("completion_tokens"))
    if got_in is None and got_out is None:
        return None
    return (got_in or 0, got_out or 0)


def id_tokens(answer: dict[str, Any]) -> Tokens | None:
    """(input, output) counted from the token ids on the answer's last output item."""
    output = answer.get("output")
    last = output[-1] if isinstance(output, list) and output else None
    if not isinstance(last, dict):
        return None
    prompt, generated = last.get(PROMPT_IDS), last.get(GENERATION_IDS)
    if not isinstance(prompt, list) or not isinstance(generated, list):
        return None
    return (len(prompt), len(generated))


def call_tokens(answer: Any) -> Tokens | None:
    """The tokens of one model call's answer (see the module docstring)."""
    if not isinstance(answer, dict):
        return None
    found = usage_tokens(answer.get("usage"))
    return found if found is not None else id_tokens(answer)


_ENV_HOPS = ("seed", "tool")


def _sum(spent: Any) -> float:
    return round(sum(spent), 4) if spent.__class__ is list else 0.0


def _count_field(verified: dict[str, Any], name: str) -> int | None:
    value = verified.get(name)
    return value if value.__class__ is int and value >= 0 else None


def rollout_cost(
    verified: dict[str, Any],
    seconds: dict[str, list[float]],
    tokens: list[list[int] | None],
    retries: dict[str, int],
) -> dict[str, Any]:
    """What one rollout cost, as its agent measured it (``rollgym_cost`` on its verify
    response; ``rollgym.collect.cost`` adds the money): its model calls and their tokens
    (``tokens``: one ``[input, output]`` per call, None where the answer said neither: kept
    as ``per_call``, in call order), the model, environment (seed and tools) and verifier
    seconds of its hops, its retries, and what the verify response says of its judge calls
    (``judge_calls``, ``judge_input_tokens``, ``judge_output_tokens``, ``judge_model``:
    ``rollgym.envs.judge``) and its sandbox CPU seconds (``sandbox_s``: ``rollgym.envs.code``,
    container verifies; CPU seconds, never wall seconds).
    Zero parts are left out."""
    tokens_in = tokens_out = unmetered = 0
    for call in tokens:
        if call is None:
            unmetered += 1
        else:
            tokens_in += call[0]
            tokens_out += call[1]
    cost: dict[str, Any] = {
        "calls": len(tokens), "input_tokens": tokens_in, "output_tokens": tokens_out,
        "per_call": tokens,
    }  # fmt: skip
    if unmetered:
        cost["unmetered_calls"] = unmetered
    response = verified.get("response")
    model = response.get("model") if response.__class__ is dict else None
    if model.__class__ is str:
        cost["model"] = model
    if took := _sum(seconds.get("model")):
        cost["model_s"] = took
    if took := _sum(seconds.get("seed")) + _sum(seconds.get("tool")):
        cost["env_s"] = round(took, 4)
    if took := _sum(seconds.get("verify")):
        cost["verify_s"] = took
    if retries:
        cost["retries"] = sum(retries.values())
    if "judge_calls" in verified and (calls := _count_field(verified, "judge_calls")):
        cost["judge_calls"] = calls
        judge_in = _count_field(verified, "judge_input_tokens")
        judge_out = _count_field(verified, "judge_output_tokens")
        if judge_in is None or judge_out is None:
            cost["judge_metered"] = False
        else:
            cost["judge_input_tokens"], cost["judge_output_tokens"] = judge_in, judge_out
            judge_model = verified.get("judge_model")
            if judge_model.__class__ is str:
                cost["judge_model"] = judge_model
    if "sandbox_s" in verified:
        sandbox = verified["sandbox_s"]
        if sandbox.__class__ in (int, float) and sandbox > 0:
            cost["sandbox_s"] = round(sandbox, 4)
    return cost
