"""verl's agent loop on rollgym: each of verl's rollouts is one rollgym rollout.

verl (0.9) runs an agent loop per dataset row (``AgentLoopBase.run(sampling_params, **row)``,
``verl/experimental/agent_loop/agent_loop.py``) and pads what it returns, an ``AgentLoopOutput``,
into its batch. ``RollgymAgentLoop`` sends the row's rollgym task to rollgym's agent server
(``RolloutClient.run``), whose model server is an ``openai_proxy`` with ``return_token_ids`` in
front of verl's own inference servers, and turns the record into the output through the one
token path (``rollgym.integrations.samples``)::

    prompt_ids        the first model call's prompt ids
    response_ids      every id after it: generations and the fed tokens between calls
    response_mask     1 where the model generated the id, 0 where it was fed (tool results, ...)
    response_logprobs the model's logprob where the mask is 1, 0.0 where it is 0
    reward_score      the verifier's reward: verl's reward loop does not recompute a set score

A rollout that cannot train (it failed, its verifier masked it, its token data is missing or
drifted, its prompt is longer than ``rollout.prompt_length``) is a masked output: one pad id of
prompt and one of response with ``response_mask`` 0, so it trains on nothing, and reward 0.0,
because verl recomputes a ``None`` reward with its own reward function. It is flagged in
``extra_fields`` (``rollgym_masked``, ``rollgym_reason``, ``rollgym_error``) and counted in
``reward_extra_info`` (``rollgym/masked``, ``rollgym/failed``). verl's GRPO counts every row of a
group in the baseline, the 0.0 too; the ``rollgym_grpo`` advantage estimator registered here is
verl's GRPO over the rows that train (``response_mask`` not all 0), so a masked rollout stays out
of its group's mean and std.

Importing this module without verl installed gives the conversion (``loop_fields``) only;
with verl it also registers the agent loop (``rollgym``) and the estimator (``rollgym_grpo``).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from rollgym.collect.records import FailedRollout, RolloutRecord
from rollgym.errors import ConfigError, RollgymError, TokenDataError
from rollgym.integrations.rows import TASK_FIELD, carried_task, task_messages
from rollgym.integrations.samples import Sample, placeholder, rollout_samples

__all__ = [
    "AGENT_NAME",
    "AGENT_URL_ENV",
    "ESTIMATOR",
    "LoopFields",
    "OnDrift",
    "dataset_row",
    "loop_fields",
    "masked_grpo",
    "task_row",
]

log = logging.getLogger(__name__)

AGENT_NAME = "rollgym"
"""The agent loop's name in verl's registry (a dataset row's ``agent_name``)."""
ESTIMATOR = "rollgym_grpo"
"""The advantage estimator's name (``algorithm.adv_estimator``)."""
AGENT_URL_ENV = "ROLLGYM_AGENT_URL"
"""Where the agent loop finds rollgym's agent server when its config names none (comma-separated
replica URLs)."""
"""The dataset column holding the rollgym task row (a JSON string, or a dict)."""

OnDrift = Literal["mask", "first"]


@dataclass(frozen=True, slots=True)
class LoopFields:
    """What one rollout gives verl's ``AgentLoopOutput``, as plain data."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: float
    num_turns: int
    masked: bool
    reason: str | None = None
    """Why it is masked: ``failed``, ``masked_by_verifier``, ``token_data``, ``drift``,
    ``reward_not_finite``, ``prompt_too_long``; None for a rollout that trains."""
    error: RollgymError | None = None
    truncated: bool = False
    """The response was cut at ``rollout.response_length`` (as verl's own loops cut it)."""
    reward: float | None = None
    """The verifier's reward (None when masked: ``reward_score`` 0.0 is no measurement)."""
    metrics: dict[str, float] = field(default_factory=dict)

    def extra_fields(self) -> dict[str, Any]:
        """``AgentLoopOutput.extra_fields``: the flags, and the counts verl carries as reward
        extra info (every output of a batch must have the same keys there)."""
        return {
            "rollgym_masked": self.masked,
            "rollgym_reason": self.reason,
            "rollgym_error": None if self.error is None else self.error.to_dict(),
            "rollgym_reward": self.reward,
            "reward_extra_info": {
                "rollgym/masked": float(self.masked),
                "rollgym/failed": float(self.reason == "failed"),
                "rollgym/truncated": float(self.truncated),
            },
        }


def loop_fields(
    record: RolloutRecord,
    *,
    pad_id: int,
    prompt_length: int,
    response_length: int,
    on_drift: OnDrift = "mask",
    vocab_size: int | None = None,
) -> LoopFields:
    """``record`` as one agent-loop output's fields (see the module docstring). One output per
    rollout: a rollout that drift cut in several samples is masked, or with
    ``on_drift="first"`` keeps its first run of calls (with the rollout's reward). With
    ``vocab_size``, an id the model cannot have produced (an upstream's bug or a hostile
    answer) masks the rollout instead of indexing past verl's embedding."""
    if prompt_length < 1 or response_length < 1:
        raise ValueError("prompt_length and response_length must be at least 1")
    try:
        samples = rollout_samples(record, on_drift="cut")
    except TokenDataError as e:
        return _masked(pad_id, "token_data", e)
    sample = samples[0]
    if sample.masked:
        reason = "failed" if isinstance(record, FailedRollout) else "masked_by_verifier"
        return _masked(pad_id, reason, sample.failure, sample)
    if len(samples) > 1 and on_drift == "mask":
        return _masked(pad_id, "drift", None, sample)
    if sample.reward is None or not math.isfinite(sample.reward):
        # A NaN or infinite reward would poison its whole group's advantages.
        return _masked(pad_id, "reward_not_finite", None, sample)
    if vocab_size is not None and max(sample.prompt_ids + sample.completion_ids) >= vocab_size:
        error = TokenDataError(
            f"rollout {record.task_index}:{record.rollout_index}: a token id is past the "
            f"tokenizer's {vocab_size} ids"
        )
        return _masked(pad_id, "token_data", error, sample)
    if len(sample.prompt_ids) > prompt_length:
        # verl's loops drop the prompt's left; that trains on a context the model never saw.
        return _masked(pad_id, "prompt_too_long", None, sample)
    truncated = len(sample.completion_ids) > response_length
    assert not isinstance(record, FailedRollout)  # a failure's sample is masked above
    output = record.response.get("output")
    fed = sum(
        1
        for item in output or []
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    )
    return LoopFields(
        list(sample.prompt_ids),
        sample.completion_ids[:response_length],
        sample.mask[:response_length],
        sample.logprobs[:response_length],
        float(sample.reward or 0.0),
        1 + sample.calls + fed,  # verl counts the user's turn, each assistant and tool turn
        False,
        truncated=truncated,
        reward=sample.reward,
        metrics=sample.metrics,
    )


def _masked(
    pad_id: int, reason: str, error: RollgymError | None, sample: Sample | None = None
) -> LoopFields:
    if sample is not None and sample.masked:
        shape = placeholder(sample, [], pad_id)
        prompt, response = shape.prompt_ids, shape.completion_ids
    else:
        prompt, response = [pad_id], [pad_id]
    metrics = {} if sample is None else sample.metrics
    return LoopFields(
        prompt, response, [0] * len(response), [0.0] * len(response), 0.0, 0, True, reason,
        error, metrics=metrics,
    )  # fmt: skip


# -- dataset rows ------------------------------------------------------------------------------


def dataset_row(
    task: Mapping[str, Any], index: int, *, data_source: str = "rollgym"
) -> dict[str, Any]:
    """A verl dataset row (one parquet record) for rollgym task row ``task``: ``prompt`` (the
    messages verl's dataset reads), ``agent_name`` (this loop), the task as JSON in
    ``rollgym_task``, and ``extra_info.index`` (the row's task index)."""
    messages = task_messages(task, index)
    return {
        "data_source": data_source,
        "prompt": messages,
        "agent_name": AGENT_NAME,
        TASK_FIELD: orjson.dumps(dict(task)).decode(),
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {"index": index},
    }


def task_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The rollgym task row inside verl's dataset row ``row`` (the agent loop's kwargs).
    A row without one is an ``InputError``: it stops verl's step, as a wrong dataset should,
    rather than be a batch of masked rollouts that trains on nothing."""
    task = row.get(TASK_FIELD)
    if task is None and isinstance(row.get("extra_info"), Mapping):
        task = row["extra_info"].get(TASK_FIELD)
    return carried_task(
        task,
        where="",
        missing=f"a verl row for the {AGENT_NAME!r} agent loop needs a {TASK_FIELD!r} column "
        "(a rollgym task row, see dataset_row)",
    )


def with_sampling(task: dict[str, Any], sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """``task`` with verl's sampling parameters in its ``responses_create_params``: the
    trainer's temperature and top_p win (its logprobs are of that distribution); top_k passes to
    vLLM unless it is verl's "off" (-1)."""
    params = dict(task.get("responses_create_params") or {})
    for name in ("temperature", "top_p"):
        value = sampling_params.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            params[name] = float(value)
    top_k = sampling_params.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:
        params["top_k"] = top_k
    return {**task, "responses_create_params": params}


# -- the advantage estimator -------------------------------------------------------------------


def masked_grpo(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[Any, Any]:
    """verl's GRPO outcome advantage (``compute_grpo_outcome_advantage``) where a group's mean
    and std are over its rows that train (``response_mask`` not all 0): a masked rollout's
    placeholder 0.0 is not in its siblings' baseline, and its own advantage is 0. A group with
    one row in all gets verl's rule for a group of one (mean 0, std 1); one trained row whose
    siblings were all masked gets 0 (no baseline to learn against)."""
    import torch

    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(_config_get(config, "norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.sum(dim=-1)
    trains = response_mask.sum(dim=-1) > 0
    advantages = torch.zeros_like(scores)
    groups: dict[Any, list[int]] = {}
    sizes: Counter[Any] = Counter()
    for i in range(scores.shape[0]):
        sizes[index[i]] += 1
        if bool(trains[i]):
            groups.setdefault(index[i], []).append(i)
    with torch.no_grad():
        for uid, rows in groups.items():
            group = scores[rows]
            if len(rows) == 1 and sizes[uid] > 1:
                # Its siblings failed: no baseline to compare with, so nothing to learn (as
                # TRL and SkyRL give it), not verl's group-of-one rule.
                continue
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = group.mean(), group.std()
            centred = group - mean
            advantages[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


def _config_get(config: Any, name: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(name, default)
    return getattr(config, name, default)


# -- the agent loop (only with verl installed) -------------------------------------------------


def _agent_urls(agent_url: str | Sequence[str] | None) -> list[str]:
    if agent_url is None:
        agent_url = os.environ.get(AGENT_URL_ENV, "")
    urls = agent_url.split(",") if isinstance(agent_url, str) else [str(u) for u in agent_url]
    urls = [u.strip() for u in urls if u.strip()]
    if not urls:
        raise ConfigError(
            f"the {AGENT_NAME!r} agent loop needs rollgym's agent server: set agent_url in its "
            f"agent-loop config, or {AGENT_URL_ENV}"
        )
    return urls


class _RolloutIndices:
    """The n-th rollout of a verl group (``uid``) in this process: rollgym's rollout index, so
    the repeats of a row are distinct rollouts (bounded: old groups are forgotten)."""

    def __init__(self, limit: int = 65536) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._limit = limit

    def next(self, uid: Any) -> int:
        key = str(uid)
        n = self._seen.pop(key, -1) + 1
        self._seen[key] = n
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return n


def _as_int(value: Any, default: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return number if number >= 0 else default


if importlib.util.find_spec("verl") is not None:  # pragma: no branch - decided by the install
    from verl.experimental.agent_loop.agent_loop import (  # type: ignore[import-not-found, unused-ignore]
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
    from verl.trainer.ppo.core_algos import (  # type: ignore[import-not-found, unused-ignore]
        register_adv_est,
    )

    from rollgym.trainer import RolloutClient

    register_adv_est(ESTIMATOR)(masked_grpo)

    _CLIENTS: dict[tuple[str, ...], RolloutClient] = {}
    _INDICES = _RolloutIndices()

    @register(AGENT_NAME)
    class RollgymAgentLoop(AgentLoopBase):  # type: ignore[misc, unused-ignore]
        """verl's agent loop that runs one rollgym rollout per call (see the module docstring).

        Options (the agent-loop config entry's keys): ``agent_url`` (rollgym's agent server,
        or its replica URLs; default ``$ROLLGYM_AGENT_URL``), ``rollout_timeout`` (seconds,
        600), ``attempts`` (a retryable failure's tries, 1), ``on_drift`` (``mask`` or
        ``first``)."""

        def __init__(
            self,
            *args: Any,
            agent_url: str | Sequence[str] | None = None,
            rollout_timeout: float = 600.0,
            attempts: int = 1,
            on_drift: OnDrift = "mask",
            **kwargs: Any,
        ) -> None:
            kwargs.pop("name", None)  # the config entry's own name, passed on by hydra
            kwargs.pop("tools", None)  # verl's tools: rollgym's environment owns the tools
            super().__init__(*args, **kwargs)
            if on_drift not in ("mask", "first"):
                raise ConfigError(f"on_drift must be 'mask' or 'first', not {on_drift!r}")
            urls = tuple(_agent_urls(agent_url))
            # One client per process and agent: verl makes a loop object per rollout.
            self.client = _CLIENTS.get(urls) or _CLIENTS.setdefault(urls, RolloutClient(urls))
            self.rollout_timeout = float(rollout_timeout)
            self.attempts = int(attempts)
            self.on_drift: OnDrift = on_drift
            pad = getattr(self.tokenizer, "pad_token_id", None)
            if pad is None:
                pad = getattr(self.tokenizer, "eos_token_id", None)
            self.pad_id = pad if isinstance(pad, int) else 0
            try:
                self.vocab_size: int | None = len(self.tokenizer)
            except TypeError:  # a tokenizer without a length: ids are not checked
                self.vocab_size = None

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            task = with_sampling(task_row(kwargs), sampling_params)
            task_index = _as_int(kwargs.get("index"))
            rollout_index = _INDICES.next(kwargs.get("uid", task_index))
            record = await self.client.run(
                task,
                task_index,
                rollout_index,
                rollout_timeout=self.rollout_timeout,
                attempts=self.attempts,
            )
            fields = loop_fields(
                record,
                pad_id=self.pad_id,
                prompt_length=int(self.rollout_config.prompt_length),
                response_length=int(self.rollout_config.response_length),
                on_drift=self.on_drift,
                vocab_size=self.vocab_size,
            )
            if fields.masked:
                log.warning(
                    "rollgym rollout %s:%s masked (%s)%s",
                    task_index,
                    rollout_index,
                    fields.reason,
                    "" if fields.error is None else f": {fields.error}",
                )
            return AgentLoopOutput(
                prompt_ids=fields.prompt_ids,
                response_ids=fields.response_ids,
                response_mask=fields.response_mask,
                response_logprobs=fields.response_logprobs,
                reward_score=fields.reward_score,
                num_turns=fields.num_turns,
                metrics=AgentLoopMetrics(
                    generate_sequences=record.duration_s, tool_calls=_tool_seconds(record)
                ),
                extra_fields=fields.extra_fields(),
            )


def _tool_seconds(record: RolloutRecord) -> float:
    if isinstance(record, FailedRollout):
        return 0.0
    timing = record.verified.get("rollgym_timing")
    spent = timing.get("tool") if isinstance(timing, dict) else None
    if not isinstance(spent, list):
        return 0.0
    return float(
        sum(
            s
            for s in spent
            if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s)
        )
    )


def __getattr__(name: str) -> Any:
    # Without verl the agent loop is not defined: say what it needs, not "no attribute".
    if name == "RollgymAgentLoop":
        raise ImportError(
            "rollgym.integrations.verl.RollgymAgentLoop needs verl (pip install verl==0.9.1); "
            "without it this module has the conversion only (loop_fields, dataset_row)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
