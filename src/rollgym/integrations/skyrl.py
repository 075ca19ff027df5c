"""SkyRL's generator on rollgym: each of SkyRL's trajectories is one rollgym rollout.

SkyRL (0.4) asks its generator for a batch (``GeneratorInterface.generate(GeneratorInput) ->
GeneratorOutput``, ``skyrl/train/generators/base.py``). ``RollgymGenerator`` runs the batch as
rollgym rollouts (``RolloutClient.collect``) on rollgym's agent server, whose model server is an
``openai_proxy`` with ``return_token_ids`` in front of SkyRL's inference engines, and builds the
output, in input order, through the one token path (``rollgym.integrations.samples``)::

    prompt_token_ids  the first model call's prompt ids
    response_ids      every id after it: generations and the fed tokens between calls
    loss_masks        1 where the model generated the id, 0 where it was fed (tool results, ...)
    rollout_logprobs  the model's logprob where the mask is 1, 0.0 where it is 0
    rewards           the verifier's reward, one per trajectory
    stop_reasons      "stop", "length" (the last call hit max_output_tokens), or rollgym_<reason>

What SkyRL gives, read from its code, and what this module does with it:

1. **Rows.** SkyRL's dataset (``PromptDataset``) hands each row's ``prompt`` (chat messages) and
   every column but ``prompt`` and ``env_class`` on as ``env_extras``; ``prepare_generator_input``
   repeats each row ``n_samples_per_prompt`` times with ``TrajectoryID(instance_id=uid,
   repetition_id=0..n-1)``. ``dataset_row`` writes a rollgym task row as such a dataset row: the
   task as JSON in ``rollgym_task``. ``plan_batch`` reads it back exactly and refuses, naming the
   input, anything it would have to guess: no ``rollgym_task``, a prompt that is not the task's
   messages, one ``instance_id`` with two different tasks, a repeated ``(instance_id,
   repetition_id)``, groups whose repetition ids are not ``0..n-1`` for one ``n``, or no
   ``trajectory_ids`` at all (then SkyRL's groups are unknown). Each ``instance_id`` is one task
   of the batch (its GRPO group), in order of first appearance; the repetition is the rollout.
2. **Sampling.** SkyRL's ``sampling_params`` (vLLM's names) are laid over every task's
   ``responses_create_params``: ``temperature``, ``top_p``, ``max_tokens`` (as
   ``max_output_tokens``), and ``top_k``/``min_p``/``stop`` when they are not vLLM's "off". The
   trainer's values win over a row's: SkyRL scores the tokens at its own temperature. Its
   engine-only keys (``logprobs``, ``min_tokens``, ``skip_special_tokens``, ...) are not sent;
   the proxy asks for logprobs itself.
3. **Masked trajectories.** A rollout that cannot train, because it failed (``FailedRollout``),
   its verifier masked it (``mask_sample``), its token data is missing or malformed
   (``TokenDataError``), or its calls drifted (a call's prompt does not extend the one before:
   SkyRL wants one sequence per trajectory), is a masked row: ``samples.placeholder``'s shape (a
   sibling's prompt ids, or one pad id; one pad id of response), loss mask all 0, so it trains
   on nothing. SkyRL has no way to leave a row out of its group's baseline: its GRPO takes the
   mean and std over every row of a uid (``compute_grpo_outcome_advantage``), and the uids are
   the trainer's, not the generator's. So the masked row's reward is the **mean reward of its
   group's rows that train** (0.0 when none does): the group's mean, the GRPO baseline, is then
   exactly the trained rows' mean, and the masked row's own advantage is 0. Not unchanged: with
   ``grpo_norm_by_std`` the std is taken over all n rows, so the k trained rows' advantages are
   scaled by ``sqrt((n-1)/(k-1))`` (same signs, same order); leave-one-out estimators (RLOO)
   likewise by ``n(k-1)/(k(n-1))``. SkyRL's ``zero_variance_filter`` counts only rows whose loss
   mask is not all 0, so it sees the same group. It is never a reward of 0 for a measured group.
4. **Counting.** ``rollout_metrics`` (which SkyRL logs with its step metrics) has
   ``rollgym/rollouts``, ``rollgym/trained``, ``rollgym/masked`` and one count per reason
   (``rollgym/failed``, ``rollgym/mask_sample``, ``rollgym/token_data``, ``rollgym/drifted``),
   ``rollgym/failed_<error type>``, and ``rollgym/reward_mean`` over the measured rollouts;
   ``env_metrics`` (one dict per row) has each row's verifier metrics, ``rollgym_masked`` and
   ``rollgym_reason``. A batch where no rollout has token data at all raises the first
   ``TokenDataError`` (the proxy lacks ``return_token_ids``: fix the config, not the batch).
   A batch that crosses the failure budget raises ``RunAborted``, as every rollgym batch does.

Step-wise training (``generator.step_wise_trajectories``) is not supported: each trajectory is
one row. Importing this module needs no SkyRL; ``RollgymGenerator`` (a subclass of SkyRL's
``GeneratorInterface``) imports SkyRL when it is first looked up.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from rollgym.collect.records import FailedRollout, RolloutRecord
from rollgym.errors import InputError, TokenDataError
from rollgym.integrations.rows import TASK_FIELD, carried_task, message_text, task_messages
from rollgym.integrations.samples import Sample, carries_tokens, placeholder, rollout_samples
from rollgym.trainer import DEFAULT_BUDGET, BudgetRules, RolloutClient, TaskGroup

__all__ = [
    "ENV_CLASS",
    "TASK_FIELD",
    "BatchPlan",
    "Reason",
    "RolloutGenerator",
    "dataset_row",
    "generator_output",
    "plan_batch",
    "task_messages",
    "with_sampling",
]

"""The dataset column (so the ``env_extras`` key) holding the rollgym task row, as JSON."""
ENV_CLASS = "rollgym"
"""The ``env_class`` of ``dataset_row``'s rows (SkyRL reads it; rollgym's agent runs them)."""

Reason = Literal["failed", "mask_sample", "token_data", "drifted"]
"""Why a row is masked."""


class TrajectoryIdLike(Protocol):
    """SkyRL's ``TrajectoryID``: the row's uid and which of its samples this is."""

    instance_id: str
    repetition_id: int


# -- dataset rows ------------------------------------------------------------------------------


def dataset_row(task: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A SkyRL dataset row for rollgym task row ``task``: ``prompt`` (its input as chat
    messages, what SkyRL's dataset filters by length and logs), ``env_class``, and the task as
    JSON in ``rollgym_task`` (it reaches the generator in ``env_extras``)."""
    return {
        "prompt": task_messages(task, index),
        "env_class": ENV_CLASS,
        TASK_FIELD: orjson.dumps(dict(task)).decode(),
    }


def _roles_and_texts(messages: Any) -> list[tuple[str, str]] | None:
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        return None
    return [(str(m.get("role")), message_text(m.get("content"))) for m in messages]


# -- the batch plan: SkyRL's inputs as rollgym tasks and rollouts ------------------------------


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """A SkyRL batch as a rollgym batch: ``tasks[t]`` run ``repeats`` times; input ``i`` is
    rollout ``slots[i] = (t, r)``."""

    tasks: list[dict[str, Any]]
    repeats: int
    slots: list[tuple[int, int]]


def plan_batch(input_batch: Mapping[str, Any]) -> BatchPlan:
    """The rollgym tasks of SkyRL's ``input_batch`` (a ``GeneratorInput``), read exactly; an
    ``InputError`` naming the input for anything ambiguous (see the module docstring, 1)."""
    prompts = input_batch.get("prompts")
    extras = input_batch.get("env_extras")
    ids: Sequence[TrajectoryIdLike] | None = input_batch.get("trajectory_ids")
    if not isinstance(prompts, list) or not prompts:
        raise InputError("GeneratorInput.prompts is empty")
    if not isinstance(extras, list) or len(extras) != len(prompts):
        raise InputError(
            f"GeneratorInput.env_extras must hold one dict per prompt ({len(prompts)}) with the "
            f"rollgym task in {TASK_FIELD!r} (see dataset_row)"
        )
    if ids is None or len(ids) != len(prompts):
        raise InputError(
            "GeneratorInput.trajectory_ids must name each prompt's uid and repetition "
            "(SkyRL's prepare_generator_input sets them): without them SkyRL's groups are unknown"
        )
    tasks: list[dict[str, Any]] = []
    keys: list[bytes] = []
    index_of: dict[str, int] = {}
    reps: dict[int, set[int]] = {}
    slots: list[tuple[int, int]] = []
    for i, (prompt, extra, tid) in enumerate(zip(prompts, extras, ids, strict=True)):
        task = _task(extra, i)
        expected = task_messages(task, i)
        if _roles_and_texts(prompt) != _roles_and_texts(expected):
            raise InputError(
                f"input {i}: the prompt is not the messages of its {TASK_FIELD} (rollgym runs "
                "the task: build the row with dataset_row, or make the prompt match)"
            )
        uid, rep = str(tid.instance_id), tid.repetition_id
        if isinstance(rep, bool) or not isinstance(rep, int) or rep < 0:
            raise InputError(f"input {i}: repetition_id {rep!r} is not a count")
        key = orjson.dumps(task, option=orjson.OPT_SORT_KEYS)
        t = index_of.get(uid)
        if t is None:
            t = index_of[uid] = len(tasks)
            tasks.append(task)
            keys.append(key)
            reps[t] = set()
        elif keys[t] != key:
            raise InputError(f"input {i}: instance_id {uid!r} names two different rollgym tasks")
        if rep in reps[t]:
            raise InputError(f"input {i}: ({uid!r}, {rep}) appears twice in the batch")
        reps[t].add(rep)
        slots.append((t, rep))
    repeats = len(reps[0])
    for t, seen in reps.items():
        if seen != set(range(repeats)):
            uid = next(u for u, at in index_of.items() if at == t)
            raise InputError(
                f"instance_id {uid!r} has repetitions {sorted(seen)}; every group of a batch "
                f"must have repetitions 0..{repeats - 1} (those of the first group)"
            )
    return BatchPlan(tasks, repeats, slots)


def _task(extra: Any, index: int) -> dict[str, Any]:
    raw = extra.get(TASK_FIELD) if isinstance(extra, Mapping) else None
    return carried_task(
        raw,
        where=f"input {index}: ",
        missing=f"input {index}: env_extras has no {TASK_FIELD!r} (a rollgym task row: build "
        "the dataset with rollgym.integrations.skyrl.dataset_row)",
    )


def with_sampling(
    task: dict[str, Any], sampling_params: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``task`` with SkyRL's sampling parameters (vLLM's names) in its
    ``responses_create_params``; the trainer's values win (see the module docstring, 2)."""
    if not sampling_params:
        return task
    params = dict(task.get("responses_create_params") or {})
    for name in ("temperature", "top_p", "min_p"):
        value = sampling_params.get(name)
        if (
            isinstance(value, (int, float))
            and _number(value)
            and not (name == "min_p" and value == 0)
        ):
            params[name] = float(value)
    top_k = sampling_params.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:
        params["top_k"] = top_k
    max_tokens = sampling_params.get("max_tokens")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
        params["max_output_tokens"] = max_tokens
    stop = sampling_params.get("stop")
    if stop:
        params["stop"] = list(stop) if isinstance(stop, (list, tuple)) else [str(stop)]
    return {**task, "responses_create_params": params}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- records to SkyRL's output -----------------------------------------------------------------


def generator_output(
    plan: BatchPlan,
    groups: Sequence[TaskGroup],
    *,
    pad_id: int,
    trajectory_ids: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` (as a plain dict) for ``groups``, the collected ``plan``, in
    the plan's input order (see the module docstring, 3 and 4)."""
    rows: list[tuple[Sample, Reason | None, RolloutRecord]] = []
    token_errors: list[TokenDataError] = []
    for t, r in plan.slots:
        record = groups[t].rollouts[r]
        sample, reason, err = _one_sample(record)
        if err is not None:
            token_errors.append(err)
        rows.append((sample, reason, record))
    if token_errors and not any(carries_tokens(record) for _, _, record in rows):
        # No rollout has token data: a misconfigured model server, not a batch to mask.
        raise TokenDataError(
            f"no rollout of the batch has token data to train on (serve the model through "
            f"openai_proxy with return_token_ids: true); the first: {token_errors[0].message}"
        ) from token_errors[0]
    trained: dict[int, list[Sample]] = {}
    for (t, _), (sample, reason, _) in zip(plan.slots, rows, strict=True):
        if reason is None:
            trained.setdefault(t, []).append(sample)
    out: dict[str, list[Any]] = {k: [] for k in _LIST_KEYS}
    counts: Counter[str] = Counter()
    for (t, _), (sample, reason, record) in zip(plan.slots, rows, strict=True):
        siblings = trained.get(t, [])
        if reason is not None:
            counts[reason] += 1
            if isinstance(record, FailedRollout):
                counts[f"failed_{record.error.type}"] += 1
            prompt = siblings[0].prompt_ids if siblings else [pad_id]
            sample = placeholder(sample, prompt, pad_id)
            rewards = [s.reward for s in siblings if s.reward is not None]
            reward = sum(rewards) / len(rewards) if rewards else 0.0
            stop = f"rollgym_{reason}"
        else:
            assert sample.reward is not None
            reward = float(sample.reward)
            stop = _stop_reason(record)
        out["prompt_token_ids"].append(sample.prompt_ids)
        out["response_ids"].append(sample.completion_ids)
        out["loss_masks"].append(sample.mask)
        out["rollout_logprobs"].append(sample.logprobs)
        out["rewards"].append(reward)
        out["stop_reasons"].append(stop)
        out["env_metrics"].append(
            {**sample.metrics, "rollgym_masked": reason is not None, "rollgym_reason": reason}
        )
    measured = [g.rewards for g in groups]
    flat = [x for rewards in measured for x in rewards]
    metrics: dict[str, float] = {
        "rollgym/rollouts": float(len(rows)),
        "rollgym/trained": float(len(rows) - sum(counts[r] for r in _REASONS)),
        "rollgym/masked": float(sum(counts[r] for r in _REASONS)),
        **{f"rollgym/{name}": float(n) for name, n in sorted(counts.items())},
    }
    if flat:
        metrics["rollgym/reward_mean"] = sum(flat) / len(flat)
    return {
        **out,
        "rollout_metrics": metrics,
        "trajectory_ids": None if trajectory_ids is None else list(trajectory_ids),
    }


_LIST_KEYS = (
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_logprobs",
    "env_metrics",
)
_REASONS: tuple[Reason, ...] = ("failed", "mask_sample", "token_data", "drifted")


def _one_sample(record: RolloutRecord) -> tuple[Sample, Reason | None, TokenDataError | None]:
    """The record's one sample, or a masked one and why (with the token error, if that was it)."""
    if isinstance(record, FailedRollout):
        return rollout_samples(record)[0], "failed", None
    if record.masked:
        return rollout_samples(record)[0], "mask_sample", None
    try:
        samples = rollout_samples(record, on_drift="cut")
    except TokenDataError as err:
        return _masked(record), "token_data", err
    if len(samples) > 1:
        return _masked(record), "drifted", None
    return samples[0], None, None


def _masked(record: RolloutRecord) -> Sample:
    metrics = {} if isinstance(record, FailedRollout) else record.metrics
    return Sample(
        record.task_index, record.rollout_index, [], [], [], [], None, True, None, 0, 0, metrics
    )


def _stop_reason(record: RolloutRecord) -> str:
    response = {} if isinstance(record, FailedRollout) else record.response
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        why = details.get("reason") if isinstance(details, dict) else None
        return "length" if why == "max_output_tokens" else str(why or "incomplete")
    return "stop"


# -- the generator -----------------------------------------------------------------------------


class RolloutGenerator:
    """The generator's work without SkyRL's base class: ``RollgymGenerator`` is this and
    SkyRL's ``GeneratorInterface``.

    ``agent``: rollgym's agent server (URL, replica URLs) or a ready ``RolloutClient``;
    ``pad_id``: the tokenizer's pad id (a masked row's placeholder tokens); ``concurrency``,
    ``rollout_timeout``, ``attempts``, ``budget``: as ``RolloutClient.collect``."""

    def __init__(
        self,
        agent: str | Sequence[str] | RolloutClient,
        *,
        pad_id: int,
        concurrency: int = 64,
        rollout_timeout: float = 600.0,
        attempts: int = 1,
        budget: BudgetRules | None = DEFAULT_BUDGET,
    ) -> None:
        self.client = agent if isinstance(agent, RolloutClient) else RolloutClient(agent)
        self.pad_id = int(pad_id)
        self.concurrency = concurrency
        self.rollout_timeout = rollout_timeout
        self.attempts = attempts
        self.budget = budget

    async def generate(self, input_batch: Any) -> Any:
        """Run ``input_batch`` (SkyRL's ``GeneratorInput``) as rollgym rollouts; SkyRL's
        ``GeneratorOutput``, in input order."""
        plan = plan_batch(input_batch)
        sampling = input_batch.get("sampling_params")
        tasks = [with_sampling(task, sampling) for task in plan.tasks]
        groups = await self.client.collect(
            tasks,
            repeats=plan.repeats,
            concurrency=self.concurrency,
            rollout_timeout=self.rollout_timeout,
            attempts=self.attempts,
            budget=self.budget,
        )
        return generator_output(
            plan, groups, pad_id=self.pad_id, trajectory_ids=input_batch.get("trajectory_ids")
        )

    async def aclose(self) -> None:
        await self.client.aclose()


@functools.cache
def _generator_class() -> type[RolloutGenerator]:
    try:
        from skyrl.train.generators.base import (  # type: ignore[import-not-found, unused-ignore]
            GeneratorInterface,
        )
    except ImportError as e:
        raise ImportError(
            f"RollgymGenerator needs SkyRL's generator types (skyrl 0.4, Python 3.12): {e}"
        ) from e

    class RollgymGenerator(RolloutGenerator, GeneratorInterface):  # type: ignore[misc, unused-ignore]
        """SkyRL's ``GeneratorInterface`` on rollgym (see ``rollgym.integrations.skyrl``)."""

    RollgymGenerator.__module__ = __name__
    return RollgymGenerator


def __getattr__(name: str) -> Any:
    # SkyRL (and torch, which its base module imports) only for the one name that needs it.
    if name == "RollgymGenerator":
        return _generator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
