"""Rollout records -> the results NeMo RL reads from ``run_examples``.

NeMo RL (``nemo_rl/environments/nemo_gym.py``, ``_postprocess_nemo_gym_to_nemo_rl_result``, and
``nemo_rl/experience/rollouts.py``) reads of each result: ``responses_create_params.input``;
``response.output``, where every item with a non-empty ``generation_token_ids`` must also carry
``prompt_token_ids`` and ``generation_log_probs``, each such item's prompt must begin with the
ids seen so far (``Non-contiguous messages found!``), at least one item must have them (else a
``ValueError``), and no logprob may be NaN; ``reward``; and ``instance_config.mask_sample``,
which zeroes the sample's loss (its reward still counts in its group's baseline). Any numeric
top-level field becomes a per-agent metric.

What rollgym hands back:

- a scored rollout: the agent's verify response as it answered, with ``mask_sample`` (false
  unless the verifier said so; a masked one says so in ``instance_config.mask_sample`` too),
  minus the indices rollgym stamped on the row to route it and the model's raw answers
  (``response.rollgym_upstream``: the token fields on the output items are what NeMo RL reads,
  and the raw ones would double what crosses Ray);
- a scored rollout whose token data NeMo RL cannot use (a turn that does not extend the ones
  before it, a field missing or not numbers): masked, its token fields kept on the usable
  turns before the first bad one and removed from it and every turn after (so NeMo RL's
  checks pass), ``rollgym_mask_reason: "token_data"``, the problem in ``failure_reason``;
- a failed rollout: never a crash and never a silent 0. ``reward: 0.0``, ``mask_sample: true``
  (and ``instance_config.mask_sample: true``), ``failure_kind`` / ``failure_reason`` and the
  ``_ng_failure_*`` fields, the typed error under ``rollgym_error`` (``RollgymError.from_dict``
  rebuilds it), ``rollgym_mask_reason: "rollout_failed"`` (``"not_dispatched"`` for a row the
  dispatch budget never started), and a ``response`` whose one output item carries the row's
  prompt ids (from the policy model's ``/tokenize``) and one placeholder generated id, so NeMo
  RL's post-processing accepts it.

A scored rollout with no token data at all is passed on unchanged: that is a model server
without ``return_token_ids``, which NeMo RL reports itself.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from typing import Any

from rollgym.errors import RollgymError, chain_text
from rollgym.nemo_gym import failures
from rollgym.nemo_gym.wire import (
    FAILURE_REASON,
    INSTANCE_CONFIG,
    NG_DISPATCH_DRAINED,
    NG_FAILURE_CLASS,
    NG_NO_PERSIST,
)
from rollgym.wire import (
    FAILURE_KIND,
    GENERATION_IDS,
    GENERATION_LOGPROBS,
    MASK_REASON,
    MASK_SAMPLE,
    PROMPT_IDS,
    ROLLGYM_ATTEMPTS,
    ROLLGYM_ERROR,
    UPSTREAM_KEY,
)

ROUTED_EXPERTS = "routed_experts"
CANCELLED = "cancelled"
"""The failure class (and ``failure_kind``) of a row its dispatch budget never started."""

TOKEN_FIELDS = (PROMPT_IDS, GENERATION_IDS, GENERATION_LOGPROBS, ROUTED_EXPERTS)
PLACEHOLDER_PROMPT = (0,)
"""The prompt of a failed row when its prompt cannot be tokenized (the model is down): id 0
exists in every vocabulary."""


def scored_result(
    verified: dict[str, Any], row: dict[str, Any], stamped: Iterable[str]
) -> dict[str, Any]:
    """NeMo RL's result for a verified rollout (see the module docstring)."""
    result = {k: v for k, v in verified.items() if k in row or k not in stamped}
    masked = bool(result.get(MASK_SAMPLE)) or bool(_instance_config(result).get(MASK_SAMPLE))
    result[MASK_SAMPLE] = masked
    response = result.get("response")
    if isinstance(response, dict) and UPSTREAM_KEY in response:
        # The upstream's raw answers: NeMo RL reads the token fields of the output items, and
        # these would double what crosses Ray (a logprob record per generated token).
        response = result["response"] = {k: v for k, v in response.items() if k != UPSTREAM_KEY}
    output = response.get("output") if isinstance(response, dict) else None
    if isinstance(output, list) and isinstance(response, dict):
        problem = token_problem(output)
        if problem is not None:
            index, why = problem
            kept = [*output[:index], *(_without_tokens(item) for item in output[index:])]
            result["response"] = {**response, "output": kept}
            result[MASK_REASON] = "token_data"
            if not result.get(FAILURE_REASON):
                result[FAILURE_REASON] = why
            masked = True
    if masked:
        mask(result)
    return result


def failed_result(
    row: dict[str, Any],
    error: RollgymError,
    attempts: int,
    prompt_ids: list[int] | None,
    *,
    model: str | None = None,
    drained: bool = False,
) -> dict[str, Any]:
    """NeMo RL's result for a rollout that did not finish: masked, never a reward to learn
    from, with the typed error (see the module docstring)."""
    prompt = list(prompt_ids) if prompt_ids else list(PLACEHOLDER_PROMPT)
    item = {
        "id": f"msg_{os.urandom(12).hex()}",
        "type": "message",
        "role": "assistant",
        "status": "incomplete",
        "content": [{"type": "output_text", "text": "", "annotations": []}],
        PROMPT_IDS: prompt,
        GENERATION_IDS: [prompt[-1]],  # a placeholder: the sample is masked, never trained on
        GENERATION_LOGPROBS: [0.0],
    }
    response = {
        "id": f"resp_{os.urandom(12).hex()}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "failed",
        "error": {"code": "server_error", "message": error.message},
        "incomplete_details": None,
        "output": [item],
        "usage": None,
    }
    result: dict[str, Any] = {
        "responses_create_params": row.get("responses_create_params"),
        "response": response,
        "reward": 0.0,
        FAILURE_KIND: CANCELLED if drained else failures.failure_kind(error),
        FAILURE_REASON: chain_text(error),  # the chain: a gateway's message alone names no cause
        **failures.sidecar_fields(error),
        ROLLGYM_ERROR: error.to_dict(),
        ROLLGYM_ATTEMPTS: attempts,
        MASK_REASON: "not_dispatched" if drained else "rollout_failed",
    }
    if drained:
        result.update({NG_FAILURE_CLASS: CANCELLED, NG_NO_PERSIST: True, NG_DISPATCH_DRAINED: True})
    mask(result)
    return result


def mask(result: dict[str, Any]) -> None:
    """Mark ``result`` masked where it is read: the top level and ``instance_config`` (which
    NeMo RL reads)."""
    result[MASK_SAMPLE] = True
    result[INSTANCE_CONFIG] = {**_instance_config(result), MASK_SAMPLE: True}


def trainable(item: Any) -> bool:
    """NeMo RL's test of an output item that becomes a training turn."""
    return isinstance(item, dict) and bool(item.get(GENERATION_IDS))


def has_token_data(result: dict[str, Any]) -> bool:
    response = result.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return isinstance(output, list) and any(trainable(item) for item in output)


def token_problem(output: list[Any]) -> tuple[int, str] | None:
    """The first output item whose token data NeMo RL would refuse, and why; None if every
    training turn is usable (or there are none). NeMo RL's rule: each turn's prompt begins with
    everything seen before it (the earlier turns' prompts and generations)."""
    seen: list[int] = []
    for index, item in enumerate(output):
        if not trainable(item):
            continue
        prompt, generated = item.get(PROMPT_IDS), item.get(GENERATION_IDS)
        logprobs = item.get(GENERATION_LOGPROBS)
        if not _ints(prompt) or not _ints(generated):
            return index, f"output item {index}: token ids missing or not integers"
        if not _numbers(logprobs) or len(logprobs) != len(generated):
            return index, (
                f"output item {index}: generation_log_probs missing, not finite numbers, or "
                "not one per generated id"
            )
        if prompt[: len(seen)] != seen:
            return index, (
                f"output item {index}: its prompt ids do not begin with the ids of the turns "
                "before it (re-tokenization drift); NeMo RL would refuse the sample"
            )
        seen = [*prompt, *generated]
    return None


def _without_tokens(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    return {k: v for k, v in item.items() if k not in TOKEN_FIELDS}


def _instance_config(result: dict[str, Any]) -> dict[str, Any]:
    found = result.get(INSTANCE_CONFIG)
    return dict(found) if isinstance(found, dict) else {}


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
    )
