"""One token path for every trainer: a rollout record in, trainer samples out.

A rollout's model calls each carry their token data on the last output item of the call
(``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``; see
``rollgym.models.tokens``). A trainer wants one sequence per rollout: the first call's prompt,
then every token after it, with a mask that says which tokens the model generated (1) and which
it was fed (0: tool results, the chat template between turns)::

    prompt_ids      = call[0].prompt
    completion_ids  = call[0].gen | call[1].prompt[len(seen):] | call[1].gen | ...
    mask            = 1...1       | 0...0                      | 1...1       | ...
    logprobs        = the model's | 0.0                        | the model's | ...

where ``seen`` is everything before a call (the previous prompt and generation). A call whose
prompt does not begin with ``seen`` (the chat template re-rendered earlier turns differently:
re-tokenization drift) cannot continue the sequence: with ``on_drift="cut"`` the rollout becomes
several samples, one per contiguous run of calls (``segment`` 0, 1, ...), each with the reward;
with ``on_drift="error"`` it is a ``TokenDataError``. Missing or malformed token data is always a
``TokenDataError`` naming the rollout and the output item: never re-tokenized, never guessed.

A failed rollout, or one its verifier masked (``mask_sample``), is one ``Sample`` with
``masked`` true and ``reward`` None: its loss must be zeroed and it must stay out of its group's
baseline. It has no tokens of its own; each adapter gives it the placeholder shape its trainer
needs (``placeholder``), never a reward of 0 to learn from.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rollgym.collect.records import FailedRollout, RolloutRecord, ScoredRollout
from rollgym.errors import RollgymError, TokenDataError
from rollgym.models.tokens import item_tokens
from rollgym.wire import TOKEN_FIELDS

__all__ = [
    "OnDrift",
    "Sample",
    "TokenCall",
    "carries_tokens",
    "group_samples",
    "placeholder",
    "rollout_calls",
    "rollout_samples",
]

OnDrift = Literal["cut", "error"]

MODEL_ITEMS = frozenset({"message", "function_call", "reasoning"})
"""Output item types the model produces; the others (``function_call_output``, ...) it was fed."""


@dataclass(frozen=True, slots=True)
class TokenCall:
    """One model call's checked token data, and the output item that carried it."""

    item: int
    prompt_ids: list[int]
    generation_ids: list[int]
    logprobs: list[float]
    policy_version: int | None = None
    """The weights' version the call ran under, where the model server said."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One trainer sample: a contiguous run of a rollout's model calls as one sequence."""

    task_index: int
    rollout_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    """One per completion id: the model's logprob where ``mask`` is 1, 0.0 where it is 0."""
    mask: list[int]
    """One per completion id: 1 where the model generated the token, 0 where it was fed it."""
    reward: float | None
    """The rollout's reward; None when ``masked`` (no measurement: never a 0 to learn from)."""
    masked: bool = False
    """True for a failed rollout or one its verifier masked: zero its loss, leave it out of
    the group's baseline."""
    failure: RollgymError | None = None
    """The typed error of a failed rollout (None for a masked one that was scored)."""
    segment: int = 0
    """Which contiguous run of calls this is (0 unless drift cut the rollout)."""
    calls: int = 0
    """How many model calls this sample holds."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The verifier's numeric fields (``ScoredRollout.metrics``)."""
    policy_versions: tuple[int | None, ...] = ()
    """Each call's weights version (None where the model server did not say), in order: a
    trainer computes staleness or importance weights from it."""

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)


def rollout_calls(record: ScoredRollout) -> list[TokenCall]:
    """The model calls of ``record``, in order, each with its checked token data.

    Raises ``TokenDataError`` when the rollout has none, when a model-produced output item is
    not followed (within its call) by an item carrying token data, or when ids or logprobs are
    malformed.
    """
    output = record.response.get("output")
    where = f"rollout {record.task_index}:{record.rollout_index}"
    if not isinstance(output, list) or not output:
        raise TokenDataError(f"{where}: the verify response has no response.output")
    calls: list[TokenCall] = []
    pending: int | None = None  # a model item not yet covered by a token-bearing item
    for index, item in enumerate(output):
        if not isinstance(item, dict):
            raise TokenDataError(f"{where}: output item {index} is not an object")
        if any(name in item for name in TOKEN_FIELDS):
            calls.append(_checked_call(item, index, where))
            pending = None
        elif item.get("type") in MODEL_ITEMS:
            if pending is None:
                pending = index
        elif pending is not None:
            raise _missing(where, pending)
    if pending is not None:
        raise _missing(where, pending)
    if not calls:
        raise TokenDataError(
            f"{where}: no model call carries token data (serve the model through openai_proxy "
            "with return_token_ids: true)"
        )
    return calls


def carries_tokens(record: RolloutRecord) -> bool:
    """Whether any output item of ``record`` carries token fields (usable or not): a model
    server without ``return_token_ids`` gives rollouts that carry none."""
    if not isinstance(record, ScoredRollout):
        return False
    output = record.response.get("output")
    return isinstance(output, list) and any(
        isinstance(item, dict) and any(name in item for name in TOKEN_FIELDS) for item in output
    )


def rollout_samples(record: RolloutRecord, *, on_drift: OnDrift = "cut") -> list[Sample]:
    """``record`` as trainer samples: one, or one per contiguous run of calls when drift cut
    it (see the module docstring). A failed or masked rollout is one masked sample with no
    tokens."""
    if isinstance(record, FailedRollout):
        return [_masked(record.task_index, record.rollout_index, record.error)]
    if record.masked:
        return [_masked(record.task_index, record.rollout_index, None, record.metrics)]
    calls = rollout_calls(record)
    runs: list[list[TokenCall]] = [[calls[0]]]
    for before, call in itertools.pairwise(calls):
        seen = before.prompt_ids + before.generation_ids
        if call.prompt_ids[: len(seen)] == seen:
            runs[-1].append(call)
            continue
        if on_drift == "error":
            raise TokenDataError(
                f"rollout {record.task_index}:{record.rollout_index}: output item {call.item}'s "
                f"prompt does not begin with the {len(seen)} ids of the calls before it "
                "(re-tokenization drift)"
            )
        runs.append([call])
    return [_joined(record, run, segment, record.metrics) for segment, run in enumerate(runs)]


def group_samples(records: Iterable[RolloutRecord], *, on_drift: OnDrift = "cut") -> list[Sample]:
    """Every record's samples, in the records' order."""
    return [s for record in records for s in rollout_samples(record, on_drift=on_drift)]


def placeholder(sample: Sample, prompt_ids: Sequence[int], pad_id: int) -> Sample:
    """A masked ``sample`` with the smallest shape a trainer accepts: ``prompt_ids`` (the row's
    prompt, or one id) and one ``pad_id`` completion token whose mask is 0, so it trains on
    nothing whatever the trainer does with the mask."""
    if not sample.masked:
        raise ValueError("placeholder() is for masked samples only")
    prompt = list(prompt_ids) or [pad_id]
    return Sample(
        sample.task_index,
        sample.rollout_index,
        prompt,
        [pad_id],
        [0.0],
        [0],
        None,
        True,
        sample.failure,
        sample.segment,
        0,
        sample.metrics,
    )


def _joined(
    record: ScoredRollout, run: list[TokenCall], segment: int, metrics: dict[str, float]
) -> Sample:
    first = run[0]
    completion = list(first.generation_ids)
    logprobs = list(first.logprobs)
    mask = [1] * len(completion)
    seen = first.prompt_ids + first.generation_ids
    for call in run[1:]:
        fed = call.prompt_ids[len(seen) :]
        completion += fed + call.generation_ids
        logprobs += [0.0] * len(fed) + call.logprobs
        mask += [0] * len(fed) + [1] * len(call.generation_ids)
        seen = call.prompt_ids + call.generation_ids
    if not any(mask):
        # Nothing to train on, and trainers index a completion's last token.
        raise TokenDataError(
            f"rollout {record.task_index}:{record.rollout_index}: its model calls (output items "
            f"{', '.join(str(c.item) for c in run)}) generated no token"
        )
    return Sample(
        record.task_index,
        record.rollout_index,
        list(first.prompt_ids),
        completion,
        logprobs,
        mask,
        record.reward,
        False,
        None,
        segment,
        len(run),
        metrics,
        tuple(call.policy_version for call in run),
    )


def _masked(
    task: int, rollout: int, error: RollgymError | None, metrics: dict[str, float] | None = None
) -> Sample:
    return Sample(task, rollout, [], [], [], [], None, True, error, 0, 0, metrics or {})


def _checked_call(item: dict[str, Any], index: int, where: str) -> TokenCall:
    t = item_tokens(item, where=f"{where}: output item {index}")
    return TokenCall(
        index, t.prompt_token_ids, t.generation_token_ids, t.generation_log_probs, t.policy_version
    )


def _missing(where: str, index: int) -> TokenDataError:
    return TokenDataError(
        f"{where}: output item {index} was produced by a model call that carries no token data"
    )
