"""The items an agent adds to a rollout, and the rollout as one Responses API response."""

from __future__ import annotations

import os
from typing import Any


def final_response(
    last: dict[str, Any], outputs: list[Any], turns: list[dict[str, Any]]
) -> dict[str, Any]:
    """The rollout as one Responses API response: every turn's output, usage summed over the
    turns, and the token-level data a model server attached to each turn (``rollgym_upstream``
    becomes a list, one entry per model call), so a trainer sees every turn it must train on."""
    final = {**last, "output": outputs}
    usages = [t["usage"] for t in turns if isinstance(t.get("usage"), dict)]
    if len(usages) > 1:
        final["usage"] = _sum_usage(usages)
    if any("rollgym_upstream" in t for t in turns):
        final["rollgym_upstream"] = [t.get("rollgym_upstream") for t in turns]
    return final


def function_call_output(call_id: str, output: str) -> dict[str, Any]:
    """A ``function_call_output`` item for the call ``call_id``."""
    # ``id`` and ``status`` make the item a valid output item too: the verified response carries
    # it in its ``output`` list, which must still parse as an OpenAI ``Response``.
    return {
        "type": "function_call_output",
        "id": f"fco_{os.urandom(12).hex()}",
        "call_id": call_id,
        "output": output,
        "status": "completed",
    }


def user_message(content: str) -> dict[str, Any]:
    """A user ``message`` item (an environment's observation)."""
    return {"type": "message", "role": "user", "content": content}


def _sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    def total(key: str, detail: str | None = None) -> int:
        out = 0
        for u in usages:
            value = (u.get(key) or {}).get(detail) if detail else u.get(key)
            out += value if isinstance(value, int) else 0
        return out

    return {
        "input_tokens": total("input_tokens"),
        "input_tokens_details": {
            "cached_tokens": total("input_tokens_details", "cached_tokens"),
            "cache_write_tokens": total("input_tokens_details", "cache_write_tokens"),
        },
        "output_tokens": total("output_tokens"),
        "output_tokens_details": {
            "reasoning_tokens": total("output_tokens_details", "reasoning_tokens")
        },
        "total_tokens": total("total_tokens"),
    }
