"""``ReasoningGymEnv``: a reasoning-gym entry's answer scored by its dataset's own
``score_answer``, in the CPU pool, under a deadline.

The row (``tasks.py``; NeMo Gym's reasoning_gym rows are read too) carries the entry: ``question``,
``answer``, ``metadata``, and ``reasoning_gym`` with the ``dataset`` (else
``metadata.source_dataset``), the ``config`` overrides it was made with and the ``restore`` patches
(``carry.py``). The answer is the reply's last ``<answer>`` block (``extract.py``; option
``extraction: nemo_gym`` falls back to a box, then the whole reply). The reward is the scorer's,
with these exceptions, each named in ``reason``:

- no ``<answer>`` block: 0 (``no_answer``), the scorer is not called;
- an answer past ``max_answer_chars``: 0 (``answer_too_long``); no dataset's reference is near
  it, and some scorers are slow on a long answer (sympy);
- an answer that says nothing (``<answer></answer>``, ``[]``, ``{}``: nothing but whitespace,
  brackets, quotes and commas) where the entry's reference says something, or the entry has
  none: 0 (``empty_answer``, ``answer_found`` 0), the scorer is not called. Here rollgym
  departs from reasoning-gym 0.1.25, whose scorers pay for nothing: arc_agi and rearc 0.05 to
  any board that parses (the empty one too, while a wrong word gets 0), boxnet and
  knight_swap 0.05, jugs, group_anagrams, graph_color and codeio 0.01 to an empty list or
  object. An entry whose own reference is empty (ab's empty output) is left to its scorer;
- an answer the scorer would run as code or misread (``nan``; ``1*2*3*4`` for puzzle24's row
  of other numbers): 0 (``answer_refused``, and ``refusal`` says why: ``guard.py``);
- the scorer raises on the answer (or returns no number in [0, 1]) but not on the entry's own
  reference: 0 (``scorer_raised``, ``scorer_error`` has the exception). Not a failure (a
  scorer's bug, prime_factorization raising on any non-integer, would spend the run's failure
  budget) and not masked (a policy would learn that an answer the scorer chokes on costs
  nothing). It raises on the reference too: the row is broken, ``ScorerError``.
- a score still running at ``verify_timeout``: ``DeadlineExceeded`` (504), never a 0; one that
  lost its worker twice: ``ScorerError`` when it ran alone, masked (``worker_lost``) beside
  other scores (a dead worker breaks every score on its pool).

A row without the ``reasoning_gym`` field carries no type patches and no config: one of a dataset
whose entries hold types JSON loses (arc_agi's boards: its reference would score 0.05) is refused
(422); one of a dataset whose scorer reads its config (puzzle24's number range, time_intervals'
tolerances) is scored with the default config, with a warning once per dataset and
``config_assumed: true`` in the answer.

Besides ``reward`` (and ``task_name``, ``score``, ``extracted_answer``) verify answers
``answer_found`` (1/0) and ``<dataset>/reward``, so ``metrics.json``'s environment metrics show the
mean reward of each dataset.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from rollgym.envs.reasoning_gym import guard
from rollgym.envs.reasoning_gym.carry import restore
from rollgym.envs.reasoning_gym.extract import Extraction, extract, says_nothing
from rollgym.envs.reasoning_gym.scoring import Scored, score_entry
from rollgym.envs.reasoning_gym.tasks import (
    ROW_FIELD,
    check_config,
    reads_config,
    registry,
    version,
)
from rollgym.envs.rows import mean_field
from rollgym.errors import ConfigError, InvalidRequest, ScorerError
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session
from rollgym.wire import MASK_SAMPLE

log = logging.getLogger("rollgym.envs.reasoning_gym")


@dataclass(frozen=True)
class Entry:
    """What a row says to score: the dataset, its config (JSON), the entry and its patches."""

    dataset: str
    config_json: str
    plain: dict[str, Any]
    patches: list[Any]
    made_by: str | None
    carried: bool  # the row has the ``reasoning_gym`` field (else no patches, no config)


class ReasoningGymEnv(ResourcesServer):
    """reasoning-gym's datasets; reward: the dataset's ``score_answer`` of the answer."""

    row_fields = frozenset({"question", "answer", "metadata", ROW_FIELD})
    reverify_mode = "stateless"  # verify reads the row and the reply

    class Options(ResourcesServer.Options):
        verify_timeout: float = Field(default=30.0, gt=0, description="seconds per score")
        max_answer_chars: int = Field(default=20_000, ge=1, description="longer answers score 0")
        extraction: Extraction = "answer_tag"

    options: Options
    scorer: ClassVar[staticmethod[..., Scored]] = staticmethod(score_entry)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._running: set[_Attempt] = set()
        self._warned: set[str] = set()  # versions and datasets warned about, once each

    def cpu_work(self) -> Callable[..., Any]:
        return type(self).scorer  # its pool starts with the server, reasoning-gym imported

    async def startup(self) -> None:
        await super().startup()
        # reasoning-gym takes a second to import: once, off the event loop, before any verify.
        await asyncio.to_thread(registry)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        entry = self._entry(task)
        answer = extract(output_text(response), self.options.extraction)
        out: dict[str, Any] = {"task_name": entry.dataset, "extracted_answer": answer}
        if answer is None:
            return self._scored(out, entry, 0.0, found=False, reason="no_answer")
        if len(answer) > self.options.max_answer_chars:
            out["extracted_answer"] = answer[:200]  # the record keeps what was refused, cut
            return self._scored(out, entry, 0.0, reason="answer_too_long")
        if says_nothing(answer, entry.plain.get("answer")):
            return self._scored(out, entry, 0.0, found=False, reason="empty_answer")
        refusal = guard.screen(entry.dataset, answer, entry.plain)
        if refusal is not None:
            out["refusal"] = refusal
            return self._scored(out, entry, 0.0, reason="answer_refused")
        if not entry.carried and reads_config(entry.dataset):
            out["config_assumed"] = True
        scored = await self._score(entry, answer)
        if scored.row_error is not None:
            raise InvalidRequest(f"reasoning_gym task: {scored.row_error}", status=422)
        if scored.entry_error is not None:
            raise ScorerError(
                f"{entry.dataset}'s score_answer raises on this row's own reference answer "
                f"({scored.entry_error}); on the reply's answer: {scored.error}",
                server=self.name,
            )
        if scored.score is None:
            out.update(scorer_error=scored.error)
            if scored.lost:  # no measurement of this answer at all
                log.info("%s: %s score masked (%s)", self.name, entry.dataset, scored.error)
                return self._scored(out, entry, 0.0, reason="worker_lost", masked=True)
            return self._scored(out, entry, 0.0, reason="scorer_raised")
        return self._scored(out, entry, scored.score)

    def _scored(
        self,
        out: dict[str, Any],
        entry: Entry,
        reward: float,
        *,
        found: bool = True,
        reason: str | None = None,
        masked: bool = False,
    ) -> dict[str, Any]:
        out.update(reward=reward, score=reward, answer_found=int(found))
        if reason is not None:
            out["reason"] = reason
        if masked:
            out[MASK_SAMPLE] = True
        else:  # a masked reward is no measurement: left out of the dataset's mean
            out[f"{entry.dataset}/reward"] = reward
        return out

    def _entry(self, task: dict[str, Any]) -> Entry:
        carried = task.get(ROW_FIELD)
        nemo_shaped = carried is None
        carried = carried or {}
        metadata = task.get("metadata")
        if not isinstance(carried, dict) or not isinstance(metadata, dict):
            raise InvalidRequest(
                f"reasoning_gym task needs 'metadata' (an object) and '{ROW_FIELD}' an object "
                "if given (rows of `rollgym tasks reasoning-gym`)",
                status=422,
            )
        dataset = carried.get("dataset", metadata.get("source_dataset"))
        if not isinstance(dataset, str):
            raise InvalidRequest(
                f"reasoning_gym task names no dataset ({ROW_FIELD}.dataset or "
                "metadata.source_dataset)",
                status=422,
            )
        names = registry()
        if dataset not in names:
            near = difflib.get_close_matches(dataset, names, n=1)
            raise InvalidRequest(
                f"reasoning_gym task: {dataset!r} is not a dataset of reasoning-gym {version()}"
                + (f" (did you mean {near[0]!r}?)" if near else ""),
                status=422,
            )
        if dataset in guard.BROKEN:
            raise InvalidRequest(
                f"reasoning_gym task: {dataset} is not scored: {guard.BROKEN[dataset]}",
                status=422,
            )
        config = carried.get("config", {})
        if not isinstance(config, dict) or not isinstance(task.get("question"), str):
            raise InvalidRequest(
                f"reasoning_gym task: {ROW_FIELD}.config must be an object and 'question' text",
                status=422,
            )
        try:
            check_config(dataset, config, f"reasoning_gym task: {ROW_FIELD}.config")
        except ConfigError as exc:
            raise InvalidRequest(exc.message, status=422) from None
        plain: dict[str, Any] = {
            k: task[k] for k in ("question", "answer", "metadata") if k in task
        }
        patches = carried.get("restore", [])
        try:
            restore(plain, patches)  # here, so a bad row is its own 422, not a scorer's failure
        except ValueError as exc:
            raise InvalidRequest(f"reasoning_gym task: {exc}", status=422) from None
        if nemo_shaped and reads_config(dataset) and dataset not in self._warned:
            self._warned.add(dataset)  # no version is named like a dataset
            log.warning(
                "%s: NeMo Gym-shaped %s rows carry no config: scored with the dataset's "
                "default config, which its scorer reads (rows made with another would be "
                "scored by the wrong rule; `rollgym tasks reasoning-gym` rows carry theirs)",
                self.name,
                dataset,
            )
        made_by = carried.get("version")
        if isinstance(made_by, str) and made_by != version() and made_by not in self._warned:
            self._warned.add(made_by)
            log.warning(
                "%s: rows made by reasoning-gym %s are scored by %s: a scorer that changed "
                "between them may score them differently",
                self.name,
                made_by,
                version(),
            )
        config_json = json.dumps(config, sort_keys=True)
        return Entry(dataset, config_json, plain, patches, made_by, not nemo_shaped)

    async def _score(self, entry: Entry, answer: str) -> Scored:
        args = (entry.dataset, entry.config_json, entry.plain, entry.patches, answer, entry.carried)
        try:
            with self._attempt():
                return await self._run(*args)
        except BrokenProcessPool:
            # A dead worker fails every score in flight on its pool, most of them innocent;
            # a score is pure, so run it once more on a fresh pool.
            log.info("%s: score lost to a broken worker pool, running it once more", self.name)
        with self._attempt() as attempt:
            try:
                return await self._run(*args)
            except BrokenProcessPool:
                if attempt.shared:  # beside others: maybe their doing, no measurement
                    return Scored(score=None, error="the worker pool broke twice", lost=True)
                raise ScorerError(
                    f"{entry.dataset}'s scorer killed its worker process twice on this answer",
                    server=self.name,
                ) from None

    async def _run(self, *args: Any) -> Scored:
        # DeadlineExceeded (a score past verify_timeout, or one that never got a worker:
        # WaitedTooLong) goes up as the verify's failure: a slow scorer is never a 0.
        result: Scored = await self.run_cpu(
            type(self).scorer, *args, timeout=self.options.verify_timeout
        )
        return result

    @contextmanager
    def _attempt(self) -> Iterator[_Attempt]:
        """One run of a score, marked ``shared`` if any other runs while it does."""
        attempt = _Attempt()
        if self._running:
            attempt.shared = True
            for other in self._running:
                other.shared = True
        self._running.add(attempt)
        try:
            yield attempt
        finally:
            self._running.discard(attempt)

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return mean_field(rollouts, "answer_found", "answer_rate")


class _Attempt:
    shared = False
