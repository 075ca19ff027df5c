"""TRL's ``GRPOTrainer`` on rollgym rollouts: a dataset of task rows, a ``rollout_func``, reward
functions that read the verifier's reward, and weight sync to the model server.

    table = TaskTable(rows)                                  # rollgym task rows
    trainer = GRPOTrainer(
        model=policy,
        args=GRPOConfig(use_vllm=False, num_generations=8, ...),
        train_dataset=table.dataset(),                       # one stamped prompt per row
        rollout_func=RolloutFunc(agent_url, table),          # rollgym collects the rollouts
        reward_funcs=[rollgym_reward],                       # the verifier's reward
        callbacks=[WeightSyncCallback(LocalModelWeights(model_url), "out/weights")],
    )

What TRL 1.16 does, read from ``trl/trainer/grpo_trainer.py``, and what this module does about it:

1. ``rollout_func(prompts, trainer)`` gets only the dataset's ``prompt`` values, each repeated
   ``num_generations`` times in a row; nothing else of the row. So the prompt carries its row:
   ``TaskTable.dataset()`` renders each row's input as chat messages and stamps the last one
   with ``rollgym_task: "<index>:<digest>"`` (the sha256 of the row's canonical JSON). Both are
   checked, so two rows with the same text stay apart and a prompt of another table is refused.
   A prompt without the stamp (a dataset you built) is matched by its exact messages; if that
   names several rows, or none, it is an error, never a guess.
2. Each run of consecutive prompts of one row is collected as that row's group (``repeats`` =
   the run's length) by ``RolloutClient.collect_sync``, which runs on its own event-loop thread:
   safe from TRL's synchronous step whatever loop runs in the caller's thread. A batch that
   crosses the failure budget raises ``RunAborted`` and so stops the training run.
3. Each record becomes one sample by ``samples.rollout_samples`` (the one token path):
   ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` (1 where the model generated
   the token, 0 where it was fed it).
4. A failed or masked rollout, or one whose token data makes no sample, is a **masked sample**:
   ``samples.placeholder``'s shape (``env_mask`` all 0, so no loss) and reward None. TRL turns a
   reward function's None into NaN; a sample for which every reward function gave NaN is left
   out of its group's mean and std (``nanmean``/``nanstd``) and its advantage is set to 0
   (``nan_to_num``): it is out of the baseline and trains on nothing, never a reward of 0. (A
   group left with one scored sample has a NaN std, so all its advantages are 0.) With several
   reward functions a sample is out only when *every* one returns None: rollgym's all do for a
   masked sample; yours must too (read ``rollgym_masked``), or TRL sums the others'
   values (``nansum``) and scores the sample. Loss types that average over sequences (``grpo``, ``sapo``, ``luspo``) count a
   masked sample as a zero in that mean (the gradient is scaled by the scored share, as for
   TRL's own masked truncations); ``dapo`` (the default), ``bnpo`` and ``cispo`` divide by
   tokens and are unaffected.
5. **Drift.** TRL takes one sample per prompt, so a rollout the token path would cut into
   segments (a call whose prompt does not extend the one before) is masked with a
   ``TokenDataError`` saying so, and counted under ``drifted``. Training on the first segment
   alone would credit it with a reward the whole rollout earned.
6. **Counting.** Every call appends a ``StepReport`` to ``RolloutFunc.reports`` and logs one
   line (logger ``rollgym.integrations.trl``); ``rollgym_reward`` logs ``rollgym/masked`` and
   ``rollgym/failed`` through TRL's ``log_metric``, so they are in the trainer's logs.

7. No ``environment_factory`` entry: with it TRL is the agent (it generates with its own model
   and calls the environment's methods as tools), which would bypass rollgym's agent, model
   server, retries, failure records and token path, what this bridge exists for.

Sampling parameters come from each row's ``responses_create_params`` (``sampling=`` lays yours
over every row). Keep their ``temperature`` equal to ``GRPOConfig.temperature``: TRL scores the
tokens at its own temperature (a mismatch is warned about once).
"""

from __future__ import annotations

import hashlib
import logging
import math
import shutil
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

import orjson
from transformers import TrainerCallback

from rollgym.collect.records import FailedRollout, RolloutRecord
from rollgym.errors import TokenDataError
from rollgym.http import Target
from rollgym.integrations.rows import TASK_FIELD, message_text, task_messages
from rollgym.integrations.samples import Sample, placeholder, rollout_samples
from rollgym.integrations.weights import WeightPush, WeightSync
from rollgym.trainer import BatchOptions, RolloutClient, TaskGroup

__all__ = [
    "TASK_KEY",
    "RolloutFunc",
    "StepReport",
    "TaskTable",
    "WeightSyncCallback",
    "metric_reward",
    "rollgym_reward",
]

log = logging.getLogger("rollgym.integrations.trl")


TASK_KEY = TASK_FIELD
"""The field of a prompt's last message that names its row: ``"<index>:<digest>"``."""

Messages = list[dict[str, Any]]


# -- the dataset --------------------------------------------------------------------------------


class TaskTable:
    """rollgym task rows, and the TRL prompts that name them exactly."""

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.rows = [dict(row) for row in rows]
        if not self.rows:
            raise ValueError("a TaskTable needs at least one row")
        self._digests = [_digest(row) for row in self.rows]
        self._by_text: dict[str, list[int]] = {}
        for index, row in enumerate(self.rows):
            self._by_text.setdefault(_text_key(task_messages(row, index)), []).append(index)

    def __len__(self) -> int:
        return len(self.rows)

    def prompt(self, index: int) -> Messages:
        """Row ``index``'s input as chat messages, the last stamped with ``TASK_KEY``."""
        messages = task_messages(self.rows[index], index)
        messages[-1] = {**messages[-1], TASK_KEY: f"{index}:{self._digests[index]}"}
        return messages

    def dataset(self) -> Any:
        """A ``datasets.Dataset`` with one ``prompt`` per row (TRL repeats them itself)."""
        from datasets import Dataset  # type: ignore[import-untyped]

        return Dataset.from_list([{"prompt": self.prompt(i)} for i in range(len(self.rows))])

    def index_of(self, prompt: Any) -> int:
        """The row ``prompt`` names: by its stamp, else by its exact messages if they name one
        row only. Raises ``ValueError`` otherwise (never a guess)."""
        stamp = _stamp(prompt)
        if stamp is not None:
            index, _, digest = stamp.partition(":")
            if not index.isdigit() or int(index) >= len(self.rows):
                raise ValueError(f"prompt stamped {stamp!r} names no row of this table")
            if self._digests[int(index)] != digest:
                raise ValueError(
                    f"prompt stamped {stamp!r} is not row {index} of this table (its digest "
                    "differs: build the dataset and the RolloutFunc from the same TaskTable)"
                )
            return int(index)
        found = self._by_text.get(_text_key(_prompt_messages(prompt)), [])
        if len(found) == 1:
            return found[0]
        if not found:
            raise ValueError(f"prompt {_short(prompt)} is no row of this table")
        raise ValueError(
            f"prompt {_short(prompt)} is the text of rows {found[:5]} (ambiguous: build the "
            "dataset with TaskTable.dataset(), whose prompts name their row)"
        )


def _digest(row: Mapping[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(row, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _prompt_messages(prompt: Any) -> Messages:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        return [{"role": m.get("role"), "content": message_text(m.get("content"))} for m in prompt]
    raise ValueError(f"a TRL prompt is a string or a list of messages, not {_short(prompt)}")


def _stamp(prompt: Any) -> str | None:
    if not isinstance(prompt, list):
        return None
    stamps = [m[TASK_KEY] for m in prompt if isinstance(m, dict) and m.get(TASK_KEY) is not None]
    if len(stamps) > 1:
        raise ValueError(f"prompt {_short(prompt)} carries {len(stamps)} {TASK_KEY} stamps")
    if stamps and not isinstance(stamps[0], str):
        raise ValueError(f"prompt {_short(prompt)}: {TASK_KEY} is not a string")
    return stamps[0] if stamps else None


def _text_key(messages: Messages) -> str:
    return orjson.dumps([[m["role"], m["content"]] for m in messages]).decode()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- the rollout function -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one ``rollout_func`` call collected, as counts."""

    step: int
    rollouts: int
    scored: int
    masked: int
    """Samples masked for any reason: the sum of the four below."""
    failed: int
    """Rollouts that ended as a ``FailedRollout``."""
    verifier_masked: int
    """Rollouts whose verifier asked to mask them (``mask_sample``)."""
    token_errors: int
    """Rollouts whose token data makes no sample (missing or malformed)."""
    drifted: int
    """Rollouts cut by re-tokenization drift."""
    failure_types: dict[str, int] = field(default_factory=dict)
    policy_versions: tuple[int, ...] = ()
    """The policy versions the scored rollouts were generated with, where the model server
    says (``rollgym_policy_version``: rollgym's CPU backend does)."""

    def line(self) -> str:
        types = ", ".join(f"{n} {t}" for t, n in sorted(self.failure_types.items()))
        return (
            f"rollgym step {self.step}: {self.rollouts} rollouts, {self.scored} scored, "
            f"{self.masked} masked ({self.failed} failed{': ' + types if types else ''}; "
            f"{self.verifier_masked} masked by the verifier; {self.token_errors} without token "
            f"data; {self.drifted} drifted)"
            + (f"; policy versions {list(self.policy_versions)}" if self.policy_versions else "")
        )


class RolloutFunc:
    """TRL's ``rollout_func``: collects the rollouts of the prompts TRL hands it through
    rollgym's agent and returns them as TRL's samples (see the module docstring).

    ``agent``: a ``RolloutClient`` (reused, not closed here), or the agent's URL(s).
    ``sampling``: keys laid over every row's ``responses_create_params`` (``temperature``,
    ``max_output_tokens``...). ``pad_token_id``: the placeholder's token (default: the
    trainer's tokenizer's pad). ``options``: ``RolloutClient.collect``'s (``concurrency``,
    ``rollout_timeout``, ``attempts``, ``budget``...; ``repeats`` comes from TRL)."""

    def __init__(
        self,
        agent: RolloutClient | str | Sequence[str] | Target,
        table: TaskTable,
        *,
        sampling: Mapping[str, Any] | None = None,
        pad_token_id: int | None = None,
        **options: Unpack[BatchOptions],
    ) -> None:
        if "repeats" in options:
            raise ValueError("repeats comes from TRL (num_generations); do not pass it")
        self._owned = not isinstance(agent, RolloutClient)
        self.client = agent if isinstance(agent, RolloutClient) else RolloutClient(agent)
        self.table = table
        self.sampling = dict(sampling or {})
        self.pad_token_id = pad_token_id
        self.options = options
        self.reports: list[StepReport] = []
        self._warned_temperature = False

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        indices = [self.table.index_of(p) for p in prompts]
        runs = _runs(indices)
        rows = [self._row(index) for index, _ in runs]
        self._check_temperature(rows, trainer)
        groups = self._collect(rows, [length for _, length in runs])
        pad = self._pad(trainer)
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "rollgym_reward": [],
            "rollgym_masked": [],
            "rollgym_failure": [],
            "rollgym_metrics": [],
            "rollgym_policy_version": [],
        }
        counts: Counter[str] = Counter()
        failure_types: Counter[str] = Counter()
        for group in groups:
            samples = [_one_sample(record, counts, failure_types) for record in group.rollouts]
            prompt = next((s.prompt_ids for s in samples if not s.masked), [pad])
            for sample in samples:
                out["rollgym_policy_version"].append(_policy_version(sample))
                if sample.masked:
                    sample = placeholder(sample, prompt, pad)
                out["prompt_ids"].append(sample.prompt_ids)
                out["completion_ids"].append(sample.completion_ids)
                out["logprobs"].append(sample.logprobs)
                out["env_mask"].append(sample.mask)
                out["rollgym_reward"].append(sample.reward)
                out["rollgym_masked"].append(sample.masked)
                out["rollgym_failure"].append(_failure_text(sample))
                out["rollgym_metrics"].append(dict(sample.metrics))
        masked = sum(out["rollgym_masked"])
        report = StepReport(
            step=int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0),
            rollouts=len(prompts),
            scored=len(prompts) - masked,
            masked=masked,
            failed=counts["failed"],
            verifier_masked=counts["verifier_masked"],
            token_errors=counts["token_errors"],
            drifted=counts["drifted"],
            failure_types=dict(failure_types),
            policy_versions=tuple(
                sorted({v for v in out["rollgym_policy_version"] if v is not None})
            ),
        )
        self.reports.append(report)
        (log.warning if masked else log.info)(report.line())
        if masked == len(prompts):
            log.warning("rollgym: every sample of this step is masked: it trains on nothing")
        return out

    def _row(self, index: int) -> dict[str, Any]:
        row = self.table.rows[index]
        if not self.sampling:
            return row
        params = {**row.get("responses_create_params", {}), **self.sampling}
        return {**row, "responses_create_params": params}

    def _collect(self, rows: list[dict[str, Any]], lengths: list[int]) -> list[TaskGroup]:
        """One group per run; runs of one length are one batch (TRL gives one length)."""
        groups: list[TaskGroup | None] = [None] * len(rows)
        for length in sorted(set(lengths)):
            where = [i for i, n in enumerate(lengths) if n == length]
            options: BatchOptions = {**self.options, "repeats": length}
            batch = self.client.collect_sync([rows[i] for i in where], **options)
            for i, group in zip(where, batch, strict=True):
                groups[i] = group
        return [g for g in groups if g is not None]

    def _pad(self, trainer: Any) -> int:
        if self.pad_token_id is not None:
            return self.pad_token_id
        processing = getattr(trainer, "processing_class", None)
        tokenizer = getattr(processing, "tokenizer", processing)
        pad = getattr(tokenizer, "pad_token_id", None)
        if not isinstance(pad, int):
            raise ValueError("no pad_token_id: pass RolloutFunc(..., pad_token_id=...)")
        return pad

    def _check_temperature(self, rows: list[dict[str, Any]], trainer: Any) -> None:
        want = getattr(getattr(trainer, "args", None), "temperature", None)
        if self._warned_temperature or not isinstance(want, (int, float)):
            return
        used = {r.get("responses_create_params", {}).get("temperature", 1.0) for r in rows}
        if used != {want}:
            self._warned_temperature = True
            log.warning(
                "rollgym: rollouts sample at temperature %s but GRPOConfig.temperature is %s; "
                "TRL scores tokens at its own (pass sampling={'temperature': %s})",
                sorted(used, key=str),
                want,
                want,
            )

    def close(self) -> None:
        """Close the client if this function made it."""
        if self._owned:
            self.client.close()


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal row indices as (index, length)."""
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][0] == index:
            runs[-1] = (index, runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs


def _one_sample(record: RolloutRecord, counts: Counter[str], types: Counter[str]) -> Sample:
    """``record`` as exactly one sample; a masked one says why in ``counts``."""
    if isinstance(record, FailedRollout):
        counts["failed"] += 1
        types[type(record.error).__name__] += 1
        return rollout_samples(record)[0]
    if record.masked:
        counts["verifier_masked"] += 1
        return rollout_samples(record)[0]
    try:
        samples = rollout_samples(record, on_drift="cut")
    except TokenDataError as err:
        counts["token_errors"] += 1
        return _masked(record, err)
    if len(samples) > 1:
        counts["drifted"] += 1
        drift = TokenDataError(
            f"rollout {record.task_index}:{record.rollout_index}: re-tokenization drift cut it "
            f"into {len(samples)} segments; TRL takes one sample per prompt, so it is masked"
        )
        return _masked(record, drift)
    sample = samples[0]
    if not math.isfinite(sample.reward or 0.0):
        counts["token_errors"] += 1  # pragma: no cover - the recorder refuses such rewards
        return _masked(record, TokenDataError(f"reward {sample.reward!r} is not finite"))
    return sample


def _policy_version(sample: Sample) -> int | None:
    """The oldest policy version among the sample's model calls, where the server named it
    (the token path reads ``rollgym_policy_version`` off each call)."""
    versions = [v for v in sample.policy_versions if v is not None]
    return min(versions) if versions else None


def _masked(record: RolloutRecord, err: TokenDataError) -> Sample:
    return Sample(record.task_index, record.rollout_index, [], [], [], [], None, True, err)


def _failure_text(sample: Sample) -> str | None:
    if sample.failure is not None:
        return f"{type(sample.failure).__name__}: {sample.failure.message}"
    return "masked by the verifier" if sample.masked else None


# -- reward functions ---------------------------------------------------------------------------


def rollgym_reward(
    rollgym_reward: list[float | None],
    rollgym_masked: list[bool] | None = None,
    rollgym_failure: list[str | None] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **_: Any,
) -> list[float | None]:
    """TRL reward function: the verifier's reward, None for a masked sample (out of the group's
    baseline, see the module docstring). Logs ``rollgym/masked`` and ``rollgym/failed``."""
    if log_metric is not None and rollgym_masked is not None:
        log_metric("rollgym/masked", float(sum(rollgym_masked)))
        failed = sum(1 for f in rollgym_failure or [] if f and f != "masked by the verifier")
        log_metric("rollgym/failed", float(failed))
    return list(rollgym_reward)


def metric_reward(name: str) -> Callable[..., list[float | None]]:
    """A TRL reward function reading the verifier's numeric field ``name`` (a sub-score); None
    where the sample is masked or the field is missing. TRL names it ``rollgym_<name>``."""

    def reward(
        rollgym_metrics: list[dict[str, float]], rollgym_masked: list[bool], **_: Any
    ) -> list[float | None]:
        return [
            None if masked else metrics.get(name)
            for metrics, masked in zip(rollgym_metrics, rollgym_masked, strict=True)
        ]

    reward.__name__ = reward.__qualname__ = f"rollgym_{name}"
    return reward


# -- weight sync --------------------------------------------------------------------------------


class WeightSyncCallback(TrainerCallback):
    """After every ``every`` optimizer steps, save the policy to ``directory/step-<n>`` and push
    it to the model server as policy version ``n`` (the trainer's global step), so the next
    rollouts come from the weights being trained (TRL collects at the start of a step, after
    this callback ran for the step before). ``versions`` records each push: (version, what
    ``push`` answered). Only the ``keep`` newest saves stay on disk. Start the server on the
    weights the trainer starts from (its version 0), or pass ``at_start=True`` to push them as
    version 0 first (a server that already serves version 0 refuses that: versions must
    increase). Single process (or process zero of plain data parallel)."""

    def __init__(
        self,
        target: WeightSync,
        directory: str | Path,
        *,
        every: int = 1,
        keep: int = 2,
        at_start: bool = False,
    ) -> None:
        if every < 1 or keep < 1:
            raise ValueError("every and keep must be at least 1")
        self.target = target
        self.directory = Path(directory)
        self.every = every
        self.keep = keep
        self.at_start = at_start
        self.versions: list[tuple[int, WeightPush]] = []
        self._saved: list[Path] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.at_start and state.is_world_process_zero:
            self._push(state.global_step, kwargs)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0 and state.is_world_process_zero:
            self._push(state.global_step, kwargs)

    def _push(self, version: int, kwargs: dict[str, Any]) -> None:
        model = kwargs.get("model")
        if model is None:
            raise ValueError("WeightSyncCallback: the trainer passed no model to its callback")
        path = self.directory / f"step-{version}"
        model.save_pretrained(path)
        processing = kwargs.get("processing_class")
        if processing is not None:
            processing.save_pretrained(path)
        answer = self.target.push_sync(path, version)
        self.versions.append((version, answer))
        log.info("rollgym: policy version %s pushed from %s", version, path)
        self._saved.append(path)
        while len(self._saved) > self.keep:
            shutil.rmtree(self._saved.pop(0), ignore_errors=True)
