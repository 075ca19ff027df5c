"""``rollgym reverify``: score the recorded rollouts of a run again, with the current verifier.

    OUT (tasks.jsonl, rollouts.jsonl, failures.jsonl)
      -> OUT2/input.jsonl (OUT's tasks, once each) -> run_collection(..., ReverifyDispatcher)
         each rollout recorded in OUT:  /seed_session, its tool calls, /verify (row + response)
         each rollout failed in OUT:    its failure, copied as it was
         each rollout not yet in OUT:   left pending (OUT2 ends aborted; --resume finishes it)
      -> OUT2: the ledger, metrics.json, run.json of a normal run, and reverify_diff.json

It is a run like any other (the one ``run_collection``, ``Collector``, ``Recorder`` and ledger), so
``--resume``, concurrency, the failure budget and typed failures are those of ``rollgym run``;
only the runner differs: it calls the environment's resources server instead of the agent:
``/seed_session``, the recorded tool calls again (a stateful environment verifies against its
session), then ``/verify`` with the recorded response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.dispatch import DispatchReport, LocalDispatcher, Runner
from rollgym.collect.metrics import pass_at_k
from rollgym.collect.orchestrate import run_collection
from rollgym.collect.peers import peers_of, resources_of
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord, ScoredRollout
from rollgym.collect.rollout import RolloutPolicy
from rollgym.collect.rundir import RunOutcome, write_json
from rollgym.config import CollectConfig, Config, RetryPolicy
from rollgym.errors import ConfigError, InternalError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.launch import Supervisor
from rollgym.protocol import check_verified, function_calls
from rollgym.server.agent import TIMING_FIELD, Hops, TimedEpisode
from rollgym.server.episode import Episode, ResourcesClient
from rollgym.wire import NG_ROLLOUT_INDEX

log = logging.getLogger("rollgym.reverify")

INPUT_FILE = "input.jsonl"
DIFF_FILE = "reverify_diff.json"
_LEDGER_KEYS = ("task_index", "rollout_index", NG_ROLLOUT_INDEX)


class RecordedRun:
    """The ledger of the run being re-verified, indexed by rollout: the byte offset of each
    success (read again when its turn comes: a run's responses can be gigabytes) and each
    failure record. Read once; a torn last line (a run still writing) is skipped."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.succeeded: dict[tuple[int, int], int] = {}
        self.failed: dict[tuple[int, int], dict[str, Any]] = {}
        path = out_dir / "rollouts.jsonl"
        if path.exists():
            with path.open("rb") as fh:
                offset = 0
                for line in fh:
                    key = _key(line)
                    if key is not None:
                        self.succeeded.setdefault(key, offset)
                    offset += len(line)
        path = out_dir / "failures.jsonl"
        if path.exists():
            with path.open("rb") as fh:
                for line in fh:
                    rec = _loads(line)
                    if rec is not None and "error" in rec:
                        self.failed[(rec["task_index"], rec["rollout_index"])] = rec
        self._fh = (out_dir / "rollouts.jsonl").open("rb") if self.succeeded else None

    def record(self, key: tuple[int, int]) -> dict[str, Any] | None:
        """The recorded rollout ``key`` (its line of ``rollouts.jsonl``), if it succeeded."""
        offset = self.succeeded.get(key)
        if offset is None or self._fh is None:
            return None
        self._fh.seek(offset)
        return _loads(self._fh.readline())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def _loads(line: bytes) -> dict[str, Any] | None:
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    ok = isinstance(rec, dict) and "task_index" in rec and "rollout_index" in rec
    return rec if ok else None


def _key(line: bytes) -> tuple[int, int] | None:
    rec = _loads(line)
    return None if rec is None else (rec["task_index"], rec["rollout_index"])


def write_input(source: Path, dest: Path) -> int:
    """Write ``source``'s tasks (its ``tasks.jsonl``, one line per task, indices dropped but
    ``_ng_task_index``) to ``dest``; return the repeats. The same ``source`` always gives the
    same bytes, so ``--resume`` finds the input of the run it resumes."""
    tasks = source / "tasks.jsonl"
    if not tasks.exists():
        raise ConfigError(f"{source}: not a run directory (no tasks.jsonl)")
    repeats = 0
    seen: set[int] = set()
    tmp = dest.with_suffix(".tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tasks.open("rb") as fh, tmp.open("wb") as out:
        for line in fh:
            if not line.strip():
                continue
            row = orjson.loads(line)
            repeats = max(repeats, int(row["rollout_index"]) + 1)
            if row["task_index"] in seen:
                continue
            seen.add(row["task_index"])
            for key in _LEDGER_KEYS:
                row.pop(key, None)
            out.write(orjson.dumps(row) + b"\n")
    tmp.replace(dest)
    return repeats


async def replay_tools(episode: Episode, row: dict[str, Any], response: dict[str, Any]) -> None:
    """Call again, in order, the tools the recorded rollout called: an environment that keeps
    per-session state (which lookups were made, a game's moves) verifies against that state, so
    a fresh session must be brought back to where the rollout left it. Only tools the row
    declares reach the server, as in the agent; their outputs are not used (the recorded
    response is what is scored)."""
    declared = {
        str(t.get("name") or (t.get("function") or {}).get("name"))
        for t in (row.get("responses_create_params") or {}).get("tools") or []
        if isinstance(t, dict)
    }
    for call in function_calls(response):
        name = str(call.get("name", ""))
        if declared and name not in declared:
            continue
        raw = call.get("arguments") or "{}"
        try:
            args = orjson.loads(raw) if isinstance(raw, str) else raw
        except orjson.JSONDecodeError:
            continue  # the agent answered it itself: nothing reached the environment
        await episode.call_tool(name, args)


@dataclass(slots=True)
class VerifyRunner:
    """A ``Runner`` that scores a recorded rollout: ``/seed_session`` with its task row (an
    environment that keeps state per session gets it back), then ``/verify`` with the row and the
    recorded response, on the ``resources`` target. Failures are typed as in any run."""

    http: HttpClient
    resources: Target
    source: RecordedRun
    policy: RolloutPolicy
    on_hold: Callable[[RollgymError], None] | None = None
    circuit_holds: int = 0
    failovers: int = 0

    async def run(self, item: RolloutItem) -> RolloutRecord:
        started = time.monotonic()
        attempts = item.prior_attempts + 1
        try:
            recorded = self.source.record((item.task_index, item.rollout_index))
            if recorded is None:  # the dispatcher sends only recorded successes
                raise InternalError(f"rollout {item.key} has no record", server="reverify")
            row = orjson.loads(item.row)
            hops = Hops()
            client = ResourcesClient(
                self.http, self.resources, tool_timeout=self.policy.timeout,
                verify_timeout=self.policy.timeout,
            )  # fmt: skip
            episode = TimedEpisode(client, item.key, hops)
            response = recorded.get("response") or {}
            await episode.seed(row)
            await replay_tools(episode, row, response)
            verified = check_verified(await episode.verify(row, response), self.resources.name)
            verified.setdefault(TIMING_FIELD, hops.to_dict())
        except RollgymError as err:
            return FailedRollout(
                item.task_index, item.rollout_index, err, attempts, time.monotonic() - started
            )
        return ScoredRollout(
            item.task_index, item.rollout_index, float(verified["reward"]), attempts,
            time.monotonic() - started, verified,
        )  # fmt: skip


class ReverifyDispatcher:
    """Local asyncio workers with a ``VerifyRunner``. Rollouts that failed in the source run
    are copied as they were, past the failure budget (they are not failures of this run);
    rollouts with no record there yet are left pending, and the run says so as it ends."""

    def __init__(
        self, source: RecordedRun, resources: str, retry: RetryPolicy, policy: RolloutPolicy,
        concurrency: int,
    ) -> None:  # fmt: skip
        self.source = source
        self.resources = resources
        self.retry = retry
        self.local = LocalDispatcher(policy, concurrency, runner=self._runner)
        self.copied = 0
        self.unrecorded = 0

    def _runner(
        self, http: HttpClient, agents: dict[str, Target], policy: RolloutPolicy,
        stopping: Callable[[], bool],
    ) -> Runner:  # fmt: skip
        # The launcher gave the agent's name the resources server's URLs (see ResourcesOnly);
        # they are called under the resources server's own retry policy.
        urls = next(iter(agents.values())).urls
        target = Target(self.resources, urls, self.retry)
        return VerifyRunner(http, target, self.source, policy)

    async def start(self, http: HttpClient, agents: dict[str, Target]) -> None:
        await self.local.start(http, agents)

    async def dispatch(self, work: Iterator[RolloutItem], pending: int, recorder: Recorder) -> None:
        await self.local.dispatch(self._verifiable(work, recorder), pending, recorder)
        if self.unrecorded and not recorder.aborted:
            recorder.abort(
                f"{self.unrecorded} rollouts have no record in {self.source.out_dir} yet (that "
                "run is unfinished); reverify them with --resume once it has them"
            )

    def _verifiable(self, work: Iterator[RolloutItem], recorder: Recorder) -> Iterator[RolloutItem]:
        for item in work:
            key = (item.task_index, item.rollout_index)
            if key in self.source.succeeded:
                yield item
            elif (failed := self.source.failed.get(key)) is not None:
                self._copy(recorder, failed)
            else:
                self.unrecorded += 1

    def _copy(self, recorder: Recorder, rec: dict[str, Any]) -> None:
        record = FailedRollout(
            rec["task_index"], rec["rollout_index"], RollgymError.from_dict(rec["error"]),
            int(rec.get("attempts", 1)), float(rec.get("duration_s", 0.0)),
        )  # fmt: skip
        # Straight to the sink: the source run's failures are no sign that this run's
        # verifier is broken, so the failure budget must not count them.
        if recorder.sink.add(record):
            recorder.recorded += 1
            self.copied += 1
            if recorder.progress is not None:
                recorder.progress.advance(failed=True)

    def cancel(self) -> None:
        self.local.cancel()

    async def close(self) -> None:
        await self.local.close()

    async def report(self) -> DispatchReport:
        report = await self.local.report()
        report.sections["reverify"] = {
            "source": str(self.source.out_dir),
            "copied_failures": self.copied,
            "unrecorded": self.unrecorded,
        }
        return report


class ResourcesOnly:
    """Starts only the resources server (and the peers its typed options name, e.g. a judge
    model) of a config. The collector needs a URL for the run's agent: it is given the
    resources server's, since here the resources server is what turns a row into a verified
    rollout; nothing else of the agent is called."""

    def __init__(self, config: Config, agent: str, resources: str, log_dir: Path, level: str):
        names = {resources} | peers_of(config, resources)
        servers = {n: s for n, s in config.servers.items() if n in names}
        sub = Config.model_validate({"servers": servers, "source": config.source})
        self.agent, self.resources = agent, resources
        self.supervisor = Supervisor(sub, log_dir=log_dir, log_level=level)

    async def start(self) -> dict[str, list[str]]:
        urls = await self.supervisor.start()
        return {**urls, self.agent: urls[self.resources]}

    async def stop(self) -> None:
        await self.supervisor.stop()

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        await self.supervisor.watch(on_fatal, pause)

    def report(self) -> dict[str, Any]:
        return self.supervisor.report()


@dataclass
class RewardChange:
    task_index: int
    rollout_index: int
    before: float
    after: float | None
    """None: the rollout now failed (its error type is in ``error``)."""
    error: str | None = None


@dataclass
class ReverifyDiff:
    """What re-verifying changed: rollouts whose reward changed (by task), and reward metrics
    of both runs over the rollouts scored in both."""

    source: str
    output: str
    compared: int = 0
    changed: list[RewardChange] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def by_task(self) -> dict[int, list[RewardChange]]:
        out: dict[int, list[RewardChange]] = {}
        for change in self.changed:
            out.setdefault(change.task_index, []).append(change)
        return out

    def to_dict(self) -> dict[str, Any]:
        by_task = {
            str(task): [_change(c) for c in changes]
            for task, changes in sorted(self.by_task().items())
        }
        return {
            "source": self.source,
            "output": self.output,
            "compared": self.compared,
            "changed": len(self.changed),
            "by_task": by_task,
            "metrics_before": self.before,
            "metrics_after": self.after,
        }


def _change(change: RewardChange) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rollout_index": change.rollout_index, "before": change.before, "after": change.after,
    }  # fmt: skip
    if change.error:
        out["error"] = change.error
    return out


def _rewards(out_dir: Path) -> dict[tuple[int, int], float]:
    rewards: dict[tuple[int, int], float] = {}
    path = out_dir / "rollouts.jsonl"
    if path.exists():
        with path.open("rb") as fh:
            for line in fh:
                rec = _loads(line)
                if rec is not None:
                    rewards[(rec["task_index"], rec["rollout_index"])] = float(rec["reward"])
    return rewards


def _reward_metrics(
    rewards: list[tuple[tuple[int, int], float]], threshold: float
) -> dict[str, Any]:
    if not rewards:
        return {"scored": 0, "reward_mean": None, "pass_at_k": {}}
    tasks: dict[int, list[float]] = {}
    for (task, _), reward in rewards:
        tasks.setdefault(task, []).append(reward)
    passes: dict[str, float] = {}
    for k in range(1, max(len(v) for v in tasks.values()) + 1):
        values = [
            pass_at_k(len(v), sum(r >= threshold for r in v), k) for v in tasks.values()
            if len(v) >= k
        ]  # fmt: skip
        passes[f"pass@{k}"] = sum(values) / len(values)
    return {
        "scored": len(rewards),
        "reward_mean": sum(r for _, r in rewards) / len(rewards),
        "pass_at_k": passes,
    }


def diff_runs(source: Path, output: Path, threshold: float = 1.0) -> ReverifyDiff:
    """Compare ``output`` (a reverify of ``source``) with ``source``: every rollout scored in
    ``source`` whose reward differs (or that failed on re-verifying), and both runs' reward
    metrics over the rollouts scored in both."""
    before, after = _rewards(source), _rewards(output)
    errors: dict[tuple[int, int], str] = {}
    failures = output / "failures.jsonl"
    if failures.exists():
        with failures.open("rb") as fh:
            for line in fh:
                rec = _loads(line)
                if rec is not None:
                    err = RollgymError.from_dict(rec["error"])
                    errors[(rec["task_index"], rec["rollout_index"])] = err.root().type
    diff = ReverifyDiff(str(source), str(output))
    both = sorted(k for k in before if k in after)
    diff.compared = len(both)
    for key in sorted(before):
        if key in after and after[key] != before[key]:
            diff.changed.append(RewardChange(*key, before[key], after[key]))
        elif key not in after and key in errors:
            diff.changed.append(RewardChange(*key, before[key], None, errors[key]))
    diff.before = _reward_metrics([(k, before[k]) for k in both], threshold)
    diff.after = _reward_metrics([(k, after[k]) for k in both], threshold)
    return diff


def _input(source: Path, output: Path) -> tuple[Path, int]:
    """``output``'s input file, written from ``source``'s tasks, and their repeats."""
    if source.resolve() == output.resolve():
        raise ConfigError(f"--output {output}: must differ from the run being re-verified")
    path = output / INPUT_FILE
    return path, write_input(source, path)


async def reverify(
    config: Config,
    collect: CollectConfig,
    source: Path,
    output: Path,
    *,
    resume: bool = False,
    agent: str | None = None,
    progress: bool = True,
    log_level: str = "WARNING",
) -> tuple[RunOutcome, ReverifyDiff]:
    """Re-verify every recorded rollout of ``source`` into ``output``; write and return the
    diff (``output/reverify_diff.json``) with the run's outcome."""
    agent_name = config.agent_name(agent or collect.agent)
    res_name = resources_of(config, agent_name)
    input_path, repeats = _input(source, output)
    collect = collect.model_copy(update={"repeats": repeats, "limit": None})
    recorded = RecordedRun(source)
    try:
        dispatcher = ReverifyDispatcher(
            recorded, res_name, config.servers[res_name].retry,
            RolloutPolicy.from_collect(collect), collect.concurrency,
        )  # fmt: skip
        launcher = ResourcesOnly(config, agent_name, res_name, output / "logs", log_level)
        outcome = await run_collection(
            config, collect, input_path, output, launcher, dispatcher=dispatcher,
            resume=resume, agent=agent_name, progress=progress,
        )  # fmt: skip
    finally:
        recorded.close()
    diff = diff_runs(source, output, collect.pass_threshold)
    write_json(output / DIFF_FILE, diff.to_dict())
    return outcome, diff
