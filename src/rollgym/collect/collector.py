"""The collector: load -> dispatch -> record -> aggregate.

``prepare_run`` validates the input and lays out the output directory before anything is sent;
``collect`` dispatches ``/run`` with at most ``concurrency`` rollouts in flight, records each one
the moment it finishes, and stops early when the failure budget says the servers are broken.
When a run aborts, in-flight rollouts are cancelled (their agents see the disconnect and stop)
and stay unrecorded, so ``--resume`` runs them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from rollgym import __version__
from rollgym.collect.failure_budget import FailureBudget
from rollgym.collect.ledger import Ledger
from rollgym.collect.metrics import compute_metrics
from rollgym.collect.progress import RunProgress
from rollgym.collect.tasks import TaskFileInfo, iter_rollouts, materialize, scan_tasks
from rollgym.config import CollectConfig, Config, RetryPolicy
from rollgym.errors import ConfigError, InternalError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.protocol import HEADER_ROLLOUT, RolloutFailure, RolloutResult, check_verified

log = logging.getLogger("rollgym.collect")

AGGREGATE_MAX_ROLLOUTS = 1_000_000  # sent to /aggregate_metrics; about 100 bytes each
CIRCUIT_WAITS = 3  # times a rollout refused by an open circuit is re-sent before it is recorded
CIRCUIT_WAIT_S = 2.0  # seconds, times the wait number (2, 4, 6: past a 5 s breaker cool-down)
RAMP_STEP = 256  # workers started per wave
RAMP_INTERVAL = 0.1  # seconds between waves

EXIT_OK = 0
EXIT_SOME_FAILED = 1
EXIT_ABORTED = 2
"""Exit codes: all rollouts succeeded / the run completed with failed rollouts / the run could
not start or was aborted (failure budget, configuration error, interrupt)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class PreparedRun:
    config: Config
    collect: CollectConfig
    out_dir: Path
    info: TaskFileInfo
    total: int
    resume: bool
    run_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunOutcome:
    status: str
    exit_code: int
    metrics: dict[str, Any]
    out_dir: Path
    abort_reason: str | None = None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def prepare_run(
    config: Config, collect: CollectConfig, input_path: Path, out_dir: Path, *, resume: bool
) -> PreparedRun:
    """Validate the input and set up (or check, on resume) the output directory."""
    agents = {name for name, server in config.servers.items() if server.kind == "agent"}
    info = scan_tasks(input_path, collect.limit, agents)
    fingerprint = {
        "input": str(input_path),
        "input_sha256": info.sha256,
        "tasks": info.tasks,
        "repeats": collect.repeats,
        "limit": collect.limit,
    }
    run_json = out_dir / "run.json"
    tasks_path = out_dir / "tasks.jsonl"
    if resume:
        if not run_json.exists() or not tasks_path.exists():
            raise ConfigError(f"{out_dir}: nothing to resume (no run.json / tasks.jsonl)")
        previous = orjson.loads(run_json.read_bytes())
        before = previous.get("inputs", {})
        _check_same_inputs(out_dir, before, fingerprint)
        total = int(previous["total"])
        run_info = previous
        run_info.setdefault("resumes", []).append(_now())
    else:
        earlier = [name for name in _RUN_FILES if (out_dir / name).exists()]
        if earlier and _never_started(out_dir):
            earlier = []  # a run that failed to start recorded nothing: start it afresh
        if earlier:
            # Even a run killed before its first record left run.json and tasks.jsonl: starting
            # over would silently replace them under a run someone may want to resume.
            raise ConfigError(
                f"{out_dir}: holds an earlier run ({', '.join(earlier)}); pass --resume to "
                "finish it, or choose another --output directory"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        total = materialize(input_path, tasks_path, collect.repeats, collect.limit)
        run_info = {"started_at": _now()}
    run_info.update(
        {
            "status": "running",
            "inputs": fingerprint,
            "total": total,
            "config": config.model_dump(mode="json"),
            "collect": collect.model_dump(mode="json"),
            "argv": sys.argv,
            "versions": {"rollgym": __version__, "python": platform.python_version()},
        }
    )
    _write_json(run_json, run_info)
    return PreparedRun(config, collect, out_dir, info, total, resume, run_info)


_RUN_FILES = ("run.json", "tasks.jsonl", "rollouts.jsonl", "failures.jsonl")
FAILED_TO_START = "failed_to_start"


def _never_started(out_dir: Path) -> bool:
    run_json = out_dir / "run.json"
    if (out_dir / "rollouts.jsonl").exists() or (out_dir / "failures.jsonl").exists():
        return False
    try:
        return bool(orjson.loads(run_json.read_bytes()).get("status") == FAILED_TO_START)
    except (OSError, orjson.JSONDecodeError):
        return False


def mark_failed_to_start(run: PreparedRun, err: RollgymError) -> None:
    """Record in ``run.json`` that the run never dispatched (its servers did not start...)."""
    run.run_info.update(
        status=FAILED_TO_START, exit_code=EXIT_ABORTED, ended_at=_now(), error=err.to_dict()
    )
    _write_json(run.out_dir / "run.json", run.run_info)


# What must match between a run and its resume, with the name a person knows it by.
_RESUME_KEYS = {
    "input_sha256": "the input file's content",
    "repeats": "--repeats",
    "limit": "--limit",
}


def _check_same_inputs(out_dir: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    for key, what in _RESUME_KEYS.items():
        if before.get(key) != now[key]:
            then, later = before.get(key), now[key]
            if key == "input_sha256":
                then = f"{before.get('input')} sha256 {str(then)[:12]}"
                later = f"{now['input']} sha256 {str(later)[:12]}"
            raise ConfigError(
                f"{out_dir}: cannot resume: {what} differs from the original run "
                f"({then} then, {later} now); resume with the same input, --repeats and "
                "--limit, or start a new output directory"
            )


class Collector:
    """Runs one prepared run against servers at ``urls``."""

    def __init__(
        self,
        run: PreparedRun,
        urls: dict[str, list[str]],
        *,
        agent: str | None = None,
        progress: bool = True,
        client: HttpClient | None = None,
    ) -> None:
        self.run = run
        self.cfg = run.collect
        config = run.config
        self.agent_name = config.agent_name(agent or self.cfg.agent)
        self.targets = {
            name: Target(name, tuple(u.rstrip("/") for u in urls[name]), config.servers[name].retry)
            for name, server in config.servers.items()
            if server.kind == "agent" and name in urls
        }
        if self.agent_name not in self.targets:
            raise ConfigError(f"no URL for agent {self.agent_name!r}")
        self.urls = urls
        self.client = client or HttpClient()
        self._own_client = client is None
        self.ledger = Ledger(run.out_dir, run.total, self.cfg.repeats)
        self.budget = FailureBudget(self.cfg)
        self.progress = RunProgress(enabled=progress)
        self.abort_reason: str | None = None
        self._workers: list[asyncio.Task[None]] = []
        self.completed_now = 0

    def _pending(self) -> Iterator[tuple[int, int, bytes]]:
        for task_index, rollout_index, raw in iter_rollouts(self.run.out_dir / "tasks.jsonl"):
            if not self.ledger.is_done(task_index, rollout_index):
                yield task_index, rollout_index, raw

    def _target_for(self, raw: bytes) -> Target:
        if b'"agent_ref"' in raw:  # cheap check first: most rows name no agent
            ref = orjson.loads(raw).get("agent_ref")
            if isinstance(ref, dict) and ref.get("name") in self.targets:
                return self.targets[ref["name"]]
        return self.targets[self.agent_name]

    async def _one(self, task_index: int, rollout_index: int, raw: bytes) -> RollgymError | None:
        """Run one rollout to a record; return its error (None on success)."""
        attempts = self.ledger.attempts_so_far(task_index, rollout_index)
        target = self._target_for(raw)
        headers = {HEADER_ROLLOUT: f"{task_index}:{rollout_index}"}
        started = time.monotonic()
        circuit_waits = 0
        while True:
            attempts += 1
            try:
                answer = await self.client.call(
                    target, "/run", raw, headers=headers, deadline=self.cfg.rollout_timeout,
                    sticky=headers[HEADER_ROLLOUT],
                )  # fmt: skip
                verified = check_verified(answer, target.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                err = exc if isinstance(exc, RollgymError) else _internal(exc)
                if (
                    err.root().type == "circuit_open"
                    and circuit_waits < CIRCUIT_WAITS
                    and self.abort_reason is None
                ):
                    # Refused unsent by an open circuit (here or in the agent): wait for the
                    # breaker's probe instead of turning every queued task into a failure
                    # during a short outage. Not an attempt: nothing reached the server.
                    circuit_waits += 1
                    attempts -= 1
                    await asyncio.sleep(CIRCUIT_WAIT_S * circuit_waits)
                    continue
                if (
                    self.cfg.retry_in_run
                    and err.retryable
                    and attempts < self.cfg.max_rollout_attempts
                    and self.abort_reason is None
                ):
                    continue
                self.ledger.record_failure(
                    RolloutFailure(
                        task_index,
                        rollout_index,
                        attempts,
                        time.monotonic() - started,
                        err.to_dict(),
                    )
                )
                return err
            self.ledger.record_success(
                RolloutResult(
                    task_index,
                    rollout_index,
                    float(verified["reward"]),
                    attempts,
                    time.monotonic() - started,
                    verified,
                )
            )
            return None

    async def _worker(self, queue: Iterator[tuple[int, int, bytes]], delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        try:
            for task_index, rollout_index, raw in queue:
                if self.abort_reason is not None:
                    return
                err = await self._one(task_index, rollout_index, raw)
                self.completed_now += 1
                self.progress.advance(failed=err is not None)
                reason = self.budget.observe(err)
                if reason is not None and self.abort_reason is None:
                    self.abort(reason)
        except Exception as exc:
            # The collector itself broke (the ledger cannot be written, the task file went
            # bad): no rollout can be recorded any more, so stop the run and say why, instead
            # of losing this worker silently in gather().
            log.exception("collector worker crashed")
            if self.abort_reason is None:
                self.abort(f"collector error: {type(exc).__name__}: {exc}")

    def abort(self, reason: str) -> None:
        """Stop dispatching and cancel in-flight rollouts (they stay pending for --resume)."""
        self.abort_reason = reason
        log.error("aborting run: %s", reason)
        current = asyncio.current_task()
        for task in self._workers:
            if task is not current:
                task.cancel()

    async def execute(self) -> RunOutcome:
        """Dispatch every pending rollout, then write metrics and ``run.json``."""
        started = time.monotonic()
        self.ledger.load(self.cfg.max_rollout_attempts)
        self.ledger.open()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(
                    sig, self.abort, f"interrupted by {signal.Signals(sig).name}"
                )
                installed.append(sig)
        try:
            self.progress.start(self.run.total, done=self.ledger.succeeded + self.ledger.failed)
            if self.ledger.pending:
                await self.dispatch()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self.progress.stop()
            self.ledger.close()
        wall = time.monotonic() - started
        try:
            return await self._finish(wall)
        finally:
            await self.close()

    async def dispatch(self) -> None:
        """Run every pending rollout to a record, at most ``concurrency`` at once (the seam
        where ``--ray`` spreads the same work over worker actors)."""
        queue = self._pending()
        n = min(self.cfg.concurrency, max(1, self.ledger.pending))
        # Ramp up in waves: thousands of simultaneous connects overflow the accept backlog,
        # time out, and would open the agent's circuit breaker before any work is done.
        self._workers = [
            asyncio.create_task(self._worker(queue, (i // RAMP_STEP) * RAMP_INTERVAL))
            for i in range(n)
        ]
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def close(self) -> None:
        """Release what the run held (the HTTP client, if it is ours)."""
        if self._own_client:
            await self.client.close()

    async def _finish(self, wall: float) -> RunOutcome:
        run = self.run
        metrics = compute_metrics(run.out_dir, run.total, self.cfg.repeats, self.cfg.pass_threshold)
        data = metrics.to_dict()
        data["pass_threshold"] = self.cfg.pass_threshold
        data["timing"] = {
            "wall_seconds": round(wall, 3),
            "rollouts_this_session": self.completed_now,
            "rollouts_per_second": round(self.completed_now / wall, 2) if wall > 0 else None,
        }
        data["http"] = {name: vars(s) for name, s in self.client.stats().items()}
        data["servers"] = await self._server_stats()
        if self.abort_reason is None:
            data["env_aggregate"] = await self._env_aggregate()
        _write_json(run.out_dir / "metrics.json", data)
        pending = metrics.total - metrics.succeeded - metrics.failed
        if self.abort_reason is not None or pending:
            status, code = "aborted", EXIT_ABORTED
        elif metrics.failed:
            status, code = "completed_with_failures", EXIT_SOME_FAILED
        else:
            status, code = "completed", EXIT_OK
        info = run.run_info
        info.update(status=status, exit_code=code, ended_at=_now())
        if self.abort_reason is not None:
            info["abort"] = {"reason": self.abort_reason, **self.budget.summary.to_dict()}
        _write_json(run.out_dir / "run.json", info)
        return RunOutcome(status, code, data, run.out_dir, self.abort_reason)

    async def _server_stats(self) -> dict[str, Any]:
        """Each server's view of the servers it called: retries, budget refusals, breaker
        state. Best effort and bounded (all at once, 5 s in all): a server that is down or
        hung simply has no entry, and an aborting run is not held up by it."""
        once = RetryPolicy(max_attempts=1, attempt_timeout=5.0)
        keys: list[str] = []
        calls = []
        for name, urls in self.urls.items():
            for i, url in enumerate(urls):
                keys.append(name if len(urls) == 1 else f"{name}[{i}]")
                target = Target.single(f"{name}.stats", url, once)
                calls.append(self.client.call(target, "/stats", {}, deadline=5.0))
        try:
            async with asyncio.timeout(5.0):
                answers = await asyncio.gather(*calls, return_exceptions=True)
        except TimeoutError:
            return {}
        return {
            key: got["calls"]
            for key, got in zip(keys, answers, strict=True)
            if isinstance(got, dict) and got.get("calls")
        }

    async def _env_aggregate(self) -> dict[str, Any]:
        """Ask the agent's resources server for environment metrics (optional endpoint)."""
        agent_cfg = self.run.config.servers[self.agent_name]
        res_name = agent_cfg.options.get("resources")
        if not res_name or res_name not in self.urls:
            return {}
        target = Target(
            res_name, tuple(self.urls[res_name]), self.run.config.servers[res_name].retry
        )
        try:
            health = await self.client.call(target, "/health", {}, deadline=10)
        except RollgymError:
            return {}
        if "aggregate_metrics" not in (health.get("features") or []):
            return {}  # the environment has none: do not ship every rollout to it
        # The request body is built as bytes, one compact record at a time: as a list of dicts
        # it would be the largest object of the whole run. Scalars only (reward, metrics,
        # short task fields); the response and the inputs stay out.
        body = bytearray(b'{"rollouts":[')
        path = self.run.out_dir / "rollouts.jsonl"
        count = 0
        if path.exists():
            with path.open("rb") as fh:
                for line in fh:
                    rec = orjson.loads(line)
                    body += orjson.dumps({k: v for k, v in rec.items() if _is_scalar(v)})
                    body += b","
                    count += 1
                    if count >= AGGREGATE_MAX_ROLLOUTS:
                        break
        if count:
            body.pop()  # the last comma
        body += b"]}"
        try:
            result = await self.client.call(target, "/aggregate_metrics", body, deadline=60)
        except RollgymError as err:
            log.warning("aggregate_metrics failed: %s", err)
            return {"error": err.to_dict()}
        return result if isinstance(result, dict) else {}


def _is_scalar(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (bool, int, float))
        or (isinstance(value, str) and len(value) <= 256)
    )


def _internal(exc: BaseException) -> RollgymError:
    log.exception("unexpected error in a rollout", exc_info=exc)
    return InternalError(f"collector: {type(exc).__name__}: {exc}", server="collector")
