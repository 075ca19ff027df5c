"""Token data for training: each model call's prompt ids, generated ids and their logprobs.

With ``return_token_ids: true`` on ``openai_proxy``, the last output item of every model call
(its message, last function call or reasoning item) carries three fields, where NeMo Gym's
``vllm_model`` puts them for NeMo RL, so a trainer reads each call's tokens exactly once::

    prompt_token_ids       the ids vLLM fed the model (the chat template applied)
    generation_token_ids   the ids it sampled, in order (integers)
    generation_log_probs   the logprob of each sampled id

vLLM offers them three ways, and the proxy asks for all that apply: ``logprobs: true,
top_logprobs: 0`` with ``return_tokens_as_token_ids: true`` (each content token is
``"token_id:N"`` with its logprob), ``return_token_ids: true`` (newer vLLM: top-level
``prompt_token_ids``, per choice ``token_ids``), and ``POST /tokenize`` for the prompt of an
older vLLM that sends no ``prompt_token_ids``. Where two sources give the same ids they must
agree; missing, malformed or disagreeing data is a ``ProtocolError`` naming the upstream, never
a guess: a wrong training record is worse than a failed rollout.

``drifted_turns`` checks the multi-turn contract: a call's prompt must begin with the previous
call's prompt and generation, or the trainer would train on a sequence the model never saw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from rollgym.errors import ProtocolError, TokenDataError
from rollgym.models.translate import unusable_answer
from rollgym.wire import (
    GENERATION_IDS,
    GENERATION_LOGPROBS,
    POLICY_VERSION,
    PROMPT_IDS,
    TOKEN_FIELDS,
)

TOKENIZE_KEYS = ("model", "messages", "tools", "chat_template_kwargs")
"""The request fields that shape the prompt; ``/tokenize`` takes no sampling parameters."""

_ID_PREFIX = "token_id:"

DRIFTED_TURNS = "drifted_turns"
"""A verified rollout's count of calls whose prompt did not extend the previous call."""
DRIFT_FIELD = "rollgym_drift"
"""A verified rollout's drift details: ``{"checked": pairs compared, "turns": [call index]}``."""
CAPTURE_FIELD = "rollgym_token_capture"
"""On a ``training-token-capture`` call answered without token data: ``{"complete": false,
"reason"}`` in the response's ``rollgym_upstream`` entry (the call is answered 200, and the
rollout's capture is incomplete)."""


@dataclass(frozen=True)
class CallTokens:
    """One model call's token data, checked: as many logprobs as generated ids."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    policy_version: int | None = None
    """The weights' version the upstream says the call ran under (``rollgym_policy_version``)."""

    def as_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            PROMPT_IDS: self.prompt_token_ids,
            GENERATION_IDS: self.generation_token_ids,
            GENERATION_LOGPROBS: self.generation_log_probs,
        }
        if self.policy_version is not None:
            fields[POLICY_VERSION] = self.policy_version
        return fields

    @classmethod
    def of_item(cls, item: Any) -> CallTokens | None:
        """The token data an output item carries, or ``None`` if it carries none."""
        if not isinstance(item, dict) or not all(
            isinstance(item.get(f), list) for f in TOKEN_FIELDS
        ):
            return None
        return cls(item[PROMPT_IDS], item[GENERATION_IDS], item[GENERATION_LOGPROBS])


def item_tokens(item: dict[str, Any], *, where: str) -> CallTokens:
    """The token data output item ``item`` carries, checked as a trainer needs it: all three
    fields, non-empty prompt ids and generated ids that are non-negative integers, one finite
    logprob (at most 0) per generated id, an integer policy version if any. The one reading of
    an item's token data (trainer samples and ``rollgym health`` both use it);
    ``TokenDataError`` says what is wrong, after ``where``."""
    missing = [name for name in TOKEN_FIELDS if name not in item]
    if missing:
        raise TokenDataError(f"{where} lacks {', '.join(missing)}")
    prompt, ids, logprobs = item[PROMPT_IDS], item[GENERATION_IDS], item[GENERATION_LOGPROBS]
    if not _token_ids(prompt) or not prompt:
        raise TokenDataError(f"{where}: prompt_token_ids are not token ids")
    if not _token_ids(ids):
        raise TokenDataError(f"{where}: generation_token_ids are not token ids")
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        count = len(logprobs) if isinstance(logprobs, list) else "no"
        raise TokenDataError(f"{where}: {len(ids)} generated ids but {count} logprobs")
    values: list[float] = []
    for value in logprobs:
        # A logprob is finite and at most 0 (a hair above, from float rounding, is kept).
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value > 1e-4
        ):
            raise TokenDataError(f"{where}: a logprob is {value!r}")
        values.append(float(value))
    version = item.get(POLICY_VERSION)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise TokenDataError(f"{where}: {POLICY_VERSION} is {version!r}")
    return CallTokens(list(prompt), list(ids), values, version)


def _token_ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def token_request(chat: dict[str, Any]) -> dict[str, Any]:
    """``chat`` asking vLLM for every token field it can give.

    ``top_logprobs: 0`` is pinned because vLLM computes no logprobs for a null
    ``top_logprobs``; a request's own ``top_logprobs`` wins (the chosen token comes first).
    """
    top = chat.get("top_logprobs")
    return {
        **chat,
        "logprobs": True,
        "top_logprobs": top if isinstance(top, int) else 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def tokenize_request(chat: dict[str, Any]) -> dict[str, Any]:
    """The ``/tokenize`` body that renders ``chat``'s prompt as the generation saw it."""
    return {k: chat[k] for k in TOKENIZE_KEYS if k in chat}


def has_logprobs(completion: Any) -> bool:
    """Whether ``completion``'s first choice carries per-token logprobs (token data to take)."""
    choices = completion.get("choices") if isinstance(completion, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    return isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list)


def needs_tokenize(completion: Any) -> bool:
    """Whether the upstream left out the prompt's ids (vLLM before ``return_token_ids``)."""
    return not (isinstance(completion, dict) and isinstance(completion.get(PROMPT_IDS), list))


def call_tokens(completion: dict[str, Any], *, upstream: str, tokenized: Any = None) -> CallTokens:
    """The checked token data of ``completion``'s first choice.

    ``tokenized`` is the upstream's ``/tokenize`` answer, used when the completion has no
    ``prompt_token_ids``.
    """
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise _protocol(upstream, "no choice to take token data from", completion)
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        # vLLM answers logprobs: null when it computed none; without them there is nothing
        # to train on, and an empty list would silently zero the loss mask.
        raise _protocol(upstream, "no per-token logprobs (choices[0].logprobs.content)", completion)
    from_logprobs: list[int] = []
    values: list[float] = []
    for n, entry in enumerate(content):
        token = entry.get("token") if isinstance(entry, dict) else None
        value = entry.get("logprob") if isinstance(entry, dict) else None
        if not (isinstance(token, str) and token.startswith(_ID_PREFIX)):
            raise _protocol(
                upstream,
                f"logprobs.content[{n}].token is {token!r}, not 'token_id:N' "
                "(return_tokens_as_token_ids ignored?)",
                completion,
            )
        try:
            from_logprobs.append(int(token.removeprefix(_ID_PREFIX)))
        except ValueError:
            raise _protocol(
                upstream, f"logprobs.content[{n}].token is {token!r}", completion
            ) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _protocol(upstream, f"logprobs.content[{n}].logprob is {value!r}", completion)
        values.append(float(value))

    # After the logprobs: without them the prompt is not rendered (a capture call's
    # ``/tokenize`` is skipped), and the logprobs are what is missing.
    prompt = completion.get(PROMPT_IDS)
    if prompt is None and isinstance(tokenized, dict):
        prompt = tokenized.get("tokens")
    if not _ints(prompt):
        raise _protocol(upstream, "no prompt token ids (prompt_token_ids or /tokenize)", completion)

    ids = choice.get("token_ids")
    if ids is None:
        ids = from_logprobs
    elif not _ints(ids):
        raise _protocol(upstream, "choices[0].token_ids is not a list of integers", completion)
    elif ids != from_logprobs:
        raise _protocol(
            upstream,
            f"choices[0].token_ids ({len(ids)} ids) disagree with the ids of "
            f"logprobs.content ({len(from_logprobs)})",
            completion,
        )
    version = completion.get(POLICY_VERSION)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise _protocol(upstream, f"{POLICY_VERSION} is {version!r}, not an integer", completion)
    return CallTokens(list(prompt), list(ids), values, version)


def attach(output: list[dict[str, Any]], tokens: CallTokens) -> None:
    """Put ``tokens`` on the last item of one call's ``output``."""
    if output:
        output[-1].update(tokens.as_fields())


@dataclass(frozen=True)
class Drift:
    """Turns whose prompt does not extend the previous call's prompt and generation."""

    checked: int
    """Consecutive pairs of calls that both carried token data."""
    turns: tuple[int, ...]
    """The (0-based) indices of the calls whose prompt drifted."""


def drifted_turns(calls: Sequence[CallTokens | None]) -> Drift:
    """Compare each call's prompt with the previous call's prompt + generation.

    Pairs where either call has no token data are not checked (and not counted as checked).
    """
    checked = 0
    drifted: list[int] = []
    for k in range(1, len(calls)):
        before, after = calls[k - 1], calls[k]
        if before is None or after is None:
            continue
        checked += 1
        seen = before.prompt_token_ids + before.generation_token_ids
        if after.prompt_token_ids[: len(seen)] != seen:
            drifted.append(k)
    return Drift(checked, tuple(drifted))


def _ints(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _protocol(upstream: str, problem: str, answer: Any) -> ProtocolError:
    return unusable_answer(upstream, f"without usable token data: {problem}", answer)
