"""The tokens one model call used, read from its answer; what a whole rollout cost.

From the upstream's ``usage`` (a Responses API answer's ``input_tokens`` / ``output_tokens``, a
chat completion's ``prompt_tokens`` / ``completion_tokens``); where the answer has no usage,
counted from the token ids it carries (``prompt_token_ids`` / ``generation_token_ids`` on its
last output item, where ``return_token_ids`` puts them: ``rollgym.models.tokens``). None when it
says neither: the call is not metered, and the cost ledger says so rather than count it as 0.

``rollout_cost`` sums a rollout's calls, hops and verify response into its ``rollgym_cost``,
where they were measured: in its agent (``rollgym.server.agent``), off the collector's hot path.

A model call that **failed** after it reached the model (``may_have_billed``: a 5xx but 503, a
timeout, a connection lost; not a refusal before anything was sent, nor a 4xx or a 503) may
have been billed: it is counted as a call (``failed_calls``) with the tokens its error's
``usage`` says (``error_tokens``: the upstream's error body, relayed in the error's ``origin``
chain), and where it says none, as a call whose tokens are not known (``unmetered_calls``).
The attempts a model server retried itself are counted the same way, from what it says of
them (``wire.FAILED_CALLS``: on its answer, or in its final error's body:
``rollgym.models.proxy``; ``error_calls``). Never estimated from the prompt: a guess would
read as a measurement. ``billed_failures`` and ``answered_call`` count one call so, for every
caller that meters its model calls: the agent's, and the judge environment's judge calls
(``judge_failed_calls``, ``judge_unmetered_calls``).

A verify that **fails** after it spent (a judge answered, then another call failed) answers its
error with that spend beside it (``rollgym.server.resources.verify_spent``: ``rollgym_cost``
on the error body, as an agent's failed ``/run``); ``verify_spend`` reads it off each failed
verify attempt, and the agent's ``Hops`` adds it to the rollout's cost, failed or not.
"""

from __future__ import annotations

from typing import Any

import orjson

from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    HTTPStatusError,
    InvalidRequest,
    RollgymError,
)
from rollgym.wire import COST_FIELD, FAILED_CALLS, GENERATION_IDS, PROMPT_IDS, UPSTREAM_KEY

Tokens = tuple[int, int]
"""(input tokens, output tokens) of one model call."""


MAX_COUNT = 2**40
"""The most tokens, calls or seconds one count from a server's answer is taken to say (about
10^12): a larger one is no measurement (``rollgym.collect.cost.MAX_PART``, the collector's
same bound, would refuse the whole cost it ends up in)."""


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else None


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


def may_have_billed(err: RollgymError) -> bool:
    """Whether a model call that failed with ``err`` may have been billed: it reached the
    model (a 5xx but 503, a timeout, a lost connection, an answer cut), not refused before it
    was sent (no connection, an open circuit, a retry budget) nor as such (a 4xx, a 503)."""
    root = err.root()
    if isinstance(root, (ConnectError, CircuitOpen, BudgetExhausted, InvalidRequest)):
        return False
    if isinstance(root, HTTPStatusError) and root.status is not None:
        # 503: a refusal (overloaded, unavailable), not work done; 429 and other 4xx too.
        return root.status >= 500 and root.status != 503
    return True


_USAGE_DEPTH = 4
"""How deep ``error_tokens`` looks into bodies relayed inside bodies."""


def error_tokens(err: RollgymError) -> Tokens | None:
    """The tokens a failed call's error says it billed: a ``usage`` in the body of any error
    of its ``origin`` chain (at the body's top level or under its ``error``; a relayed body
    inside it, as a string, is read too); None: none says one."""
    seen: RollgymError | None = err
    while seen is not None:
        if seen.body and "usage" in seen.body and not seen.truncated:
            found = _body_usage(seen.body, _USAGE_DEPTH)
            if found is not None:
                return found
        seen = seen.origin
    return None


def error_calls(err: RollgymError) -> tuple[list[list[int] | None], str | None]:
    """The calls a failed model call's error says were billed, and their model: a model
    server's ``rollgym_failed_calls`` (every upstream attempt it tried: ``rollgym.models.proxy``)
    in the body of an error of its ``origin`` chain, else the one call of ``error_tokens``
    (``[None]``: said nothing)."""
    seen: RollgymError | None = err
    while seen is not None:
        if seen.body and FAILED_CALLS in seen.body and not seen.truncated:
            try:
                data = orjson.loads(seen.body)
            except orjson.JSONDecodeError:
                data = None
            if isinstance(data, dict) and isinstance(data.get(FAILED_CALLS), list):
                calls: list[list[int] | None] = []
                if count_failed(data[FAILED_CALLS], calls):
                    model = data.get("model")
                    return calls, model if isinstance(model, str) else None
        seen = seen.origin
    used = error_tokens(err)
    return [None if used is None else list(used)], None


def _body_usage(text: str, depth: int) -> Tokens | None:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return _usage_in(data, depth)


def _usage_in(data: Any, depth: int) -> Tokens | None:
    if depth <= 0 or not isinstance(data, dict):
        return None
    found = usage_tokens(data.get("usage"))
    if found is not None:
        return found
    for key in ("error", "origin"):
        found = _usage_in(data.get(key), depth - 1)
        if found is not None:
            return found
    body = data.get("body")
    if isinstance(body, str) and "usage" in body:
        return _body_usage(body, depth - 1)
    return None


def count_failed(said: Any, tokens: list[list[int] | None]) -> int:
    """Append to ``tokens`` the failed attempts a model server said it retried
    (``wire.FAILED_CALLS``: ``[input, output]`` or null each); how many. Not a list of such:
    nothing (a model server's field, not the model's output, but read with care)."""
    if not isinstance(said, list):
        return 0
    n = 0
    for call in said:
        if call is None:
            tokens.append(None)
        elif (
            isinstance(call, list)
            and len(call) == 2
            and (got_in := _count(call[0])) is not None
            and (got_out := _count(call[1])) is not None
        ):
            tokens.append([got_in, got_out])
        else:
            continue
        n += 1
    return n


def billed_failures(
    failed: list[RollgymError], tokens: list[list[int] | None]
) -> tuple[int, str | None]:
    """Append to ``tokens`` the calls that the failed attempts ``failed`` of one model call
    (``rollgym.http.failed_attempts.collecting``) may have been billed for (``may_have_billed``,
    ``error_calls``): how many, and the model an error named (None: none did)."""
    n, model = 0, None
    for err in failed:
        if may_have_billed(err):
            calls, named = error_calls(err)
            tokens.extend(calls)
            n += len(calls)
            model = model or named
    return n, model


def answered_call(answer: Any, tokens: list[list[int] | None]) -> int:
    """Append to ``tokens`` an answered model call's: the failed attempts its model server
    says it retried (``wire.FAILED_CALLS`` on its ``rollgym_upstream`` entry), then its own
    (None: its answer said neither); how many of them failed."""
    n = 0
    upstream = answer.get(UPSTREAM_KEY) if isinstance(answer, dict) else None
    if upstream.__class__ is dict and (retried := upstream.get(FAILED_CALLS)):
        n = count_failed(retried, tokens)
    used = call_tokens(answer)
    tokens.append(None if used is None else list(used))
    return n


VERIFY_SPEND = (
    "judge_calls", "judge_failed_calls", "judge_input_tokens", "judge_output_tokens",
    "judge_unmetered_calls",
)  # fmt: skip
"""The counts a failed verify may say it spent (``verify_spend``), summed over its attempts."""


def verify_spend(err: RollgymError, into: dict[str, Any]) -> None:
    """Add to ``into`` what a failed verify attempt says it spent: the ``rollgym_cost`` beside
    the error in its resources server's answer (its judge calls: ``VERIFY_SPEND``, and
    ``judge_model``); nothing when it says none (another server's answer, a timeout)."""
    body = err.body
    if not body or COST_FIELD not in body or err.truncated:
        return
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    said = data.get(COST_FIELD) if isinstance(data, dict) else None
    if not isinstance(said, dict):
        return
    for key in VERIFY_SPEND:
        if (got := _count(said.get(key))) is not None:
            into[key] = into.get(key, 0) + got
    if isinstance(model := said.get("judge_model"), str):
        into["judge_model"] = model


def without_spend(err: RollgymError) -> RollgymError:
    """``err`` without the ``rollgym_cost`` its body carried beside the error
    (``verify_spend`` read it): the rollout's cost says it, once."""
    body = err.body
    if not body or COST_FIELD not in body or err.truncated:
        return err
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return err
    if not isinstance(data, dict) or data.pop(COST_FIELD, None) is None:
        return err
    return err.with_fields(body=orjson.dumps(data).decode())


def with_verify_spend(verified: dict[str, Any], spent: dict[str, Any]) -> dict[str, Any]:
    """``verified`` (a verify response) with ``spent`` (its failed attempts': ``verify_spend``)
    added to its judge counts: a new dict, ``verified`` itself when nothing was spent."""
    if not spent:
        return verified
    out = {**verified}
    for key in VERIFY_SPEND:
        if key in spent:
            own = _count_field(verified, key)
            if (
                key in ("judge_input_tokens", "judge_output_tokens")
                and own is None
                and (_count_field(verified, "judge_calls"))
            ):
                continue  # its own calls' tokens are not known: the sum would not be either
            out[key] = (own or 0) + spent[key]
    if "judge_model" not in out and "judge_model" in spent:
        out["judge_model"] = spent["judge_model"]
    return out


_ENV_HOPS = ("seed", "tool")


def _sum(spent: Any) -> float:
    return round(sum(spent), 4) if spent.__class__ is list else 0.0


def _count_field(verified: dict[str, Any], name: str) -> int | None:
    value = verified.get(name)
    return value if value.__class__ is int and 0 <= value <= MAX_COUNT else None


def rollout_cost(
    verified: dict[str, Any],
    seconds: dict[str, list[float]],
    tokens: list[list[int] | None],
    retries: dict[str, int],
    failed_calls: int = 0,
) -> dict[str, Any]:
    """What one rollout cost, as its agent measured it (``rollgym_cost`` on its verify
    response; ``rollgym.collect.cost`` adds the money): its model calls and their tokens
    (``tokens``: one ``[input, output]`` per call, None where the answer said neither: kept
    as ``per_call``, in call order; ``failed_calls`` of them failed), the model, environment (seed and tools) and verifier
    seconds of its hops, its retries, and what the verify response says of its judge calls
    (``judge_calls``, ``judge_failed_calls``, ``judge_input_tokens``, ``judge_output_tokens``,
    ``judge_unmetered_calls``, ``judge_model``: ``rollgym.envs.judge``) and its sandbox CPU seconds (``sandbox_s``: ``rollgym.envs.code``,
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
    if failed_calls:
        cost["failed_calls"] = failed_calls  # among ``calls``: see the module docstring
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
        # Its judge's calls, failed ones that may have been billed among them: counted as the
        # model calls above (``rollgym.envs.judge``).
        cost["judge_calls"] = calls
        if failed := _count_field(verified, "judge_failed_calls"):
            cost["judge_failed_calls"] = failed
        judge_in = _count_field(verified, "judge_input_tokens")
        judge_out = _count_field(verified, "judge_output_tokens")
        unmetered = _count_field(verified, "judge_unmetered_calls") or 0
        if judge_in is None or judge_out is None:
            unmetered = calls  # an environment that says its calls, not their tokens
        else:
            cost["judge_input_tokens"], cost["judge_output_tokens"] = judge_in, judge_out
        if unmetered:
            cost["judge_unmetered_calls"] = min(unmetered, calls)
        judge_model = verified.get("judge_model")
        if judge_model.__class__ is str:
            cost["judge_model"] = judge_model
    if "sandbox_s" in verified:
        sandbox = verified["sandbox_s"]
        if sandbox.__class__ in (int, float) and 0 < sandbox <= MAX_COUNT:
            cost["sandbox_s"] = round(sandbox, 4)
    return cost
