"""The tokens one model call used, read from its answer.

From the upstream's ``usage`` (a Responses API answer's ``input_tokens`` / ``output_tokens``, a
chat completion's ``prompt_tokens`` / ``completion_tokens``); where the answer has no usage,
counted from the token ids it carries (``prompt_token_ids`` / ``generation_token_ids`` on its
last output item, where ``return_token_ids`` puts them: ``rollgym.models.tokens``). None when it
says neither: the call is not metered, and the cost ledger says so rather than count it as 0.
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
