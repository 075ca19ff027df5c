"""The collector: one run, from its prepared directory to ``metrics.json`` and ``run.json``.

    pending rollouts (tasks.jsonl minus the ledger) -> dispatcher -> rollout core -> recorder
        -> ledger files, progress, failure budget -> metrics, run.json

The dispatcher (``LocalDispatcher`` here, ``RayDispatcher`` on a cluster) decides where rollouts
run; everything else is this one path. When a run aborts, in-flight rollouts are cancelled
(their agents see the disconnect and stop) and stay unrecorded, so ``--resume`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from rollgym.collect.dispatch import Dispatcher, LocalDispatcher
from rollgym.collect.failure_budget import BudgetRules, FailureBudget
from rollgym.collect.launchers import RunAgents
from rollgym.collect.ledger import Ledger
from rollgym.collect.live import RunWatch
from rollgym.collect.metrics import compute_metrics
from rollgym.collect.peers import resources_of
from rollgym.collect.progress import RunProgress
from rollgym.collect.provenance import ask_fingerprints
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import RolloutItem
from rollgym.collect.required import check_rows
from rollgym.collect.rollout import RolloutPolicy
from rollgym.collect.route import BY_AGENT, AgentRoute
from rollgym.collect.rundir import (
    EXIT_ABORTED,
    EXIT_BUDGET,
    EXIT_OK,
    EXIT_SOME_FAILED,
    PreparedRun,
    RunOutcome,
    mark_code,
    mark_finished,
    write_json,
)
from rollgym.collect.spend import RunSpend
from rollgym.collect.tasks import ROLLGYM_ROW_FIELDS, iter_rollouts
from rollgym.collect.undeclared import UndeclaredTools
from rollgym.collect.unscripted import unscripted_warning
from rollgym.config import DISPATCH_KINDS, RetryPolicy, format_validation_error
from rollgym.errors import ConfigError, ProtocolError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.server.aggregate import AggregateMetrics
from rollgym.server.provenance import LoadedCode

log = logging.getLogger("rollgym.collect")

AGGREGATE_MAX_ROLLOUTS = 1_000_000  # sent to /aggregate_metrics; about 100 bytes each


class Collector:
    """Runs one prepared run against servers at ``urls`` (name -> replica URLs), dispatching
    with ``dispatcher`` (default: asyncio workers in this process)."""

    def __init__(
        self,
        run: PreparedRun,
        urls: dict[str, list[str]],
        *,
        agent: str | None = None,
        progress: bool = True,
        client: HttpClient | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.run = run
        self.cfg = run.collect
        config = run.config
        # Resolved by the run's orchestration (``RunAgents``); here only for a direct caller.
        # None: the config has several agents and names none; every row names its own.
        self.agent_name = agent if agent is not None else config.default_dispatcher(self.cfg.agent)
        self.targets = {
            name: Target(name, tuple(u.rstrip("/") for u in urls[name]), config.servers[name].retry)
            for name, server in config.servers.items()
            if server.kind in DISPATCH_KINDS and name in urls
        }
        RunAgents(self.agent_name).require_url(self.targets, config)
        self.route = AgentRoute.of(config, self.cfg, self.agent_name)
        for ref in sorted(run.info.named(BY_AGENT)):
            routed = self.route.agent_for(ref)
            if routed is not None and routed not in self.targets:
                # Sent to the default agent instead, it would run under another agent's loop.
                raise ConfigError(
                    f"task rows name agent {ref!r}, run by server {routed!r}, which has no URL: "
                    f"pass --servers {routed}=URL, or --agent to run every row with one agent"
                )
        for by, name in sorted(r for r in run.info.routes if r[0] != BY_AGENT):
            routed = self.route.server(by, name)
            if routed is not None and routed not in self.targets:
                raise ConfigError(
                    f"task rows of {by} {name!r} go to server {routed!r}, which has no "
                    f"URL: pass --servers {routed}=URL"
                )
        self.urls = {name: list(u) for name, u in urls.items()}
        self.client = client or HttpClient()
        self._own_client = client is None
        self.dispatcher = dispatcher or LocalDispatcher(
            RolloutPolicy.from_collect(self.cfg), self.cfg.concurrency, dialects=run.dialects
        )
        self.ledger = Ledger(run.out_dir, run.total, self.cfg.repeats)
        self.progress = RunProgress(enabled=progress)
        self.recorder = Recorder(self.ledger, FailureBudget(BudgetRules.from_collect(self.cfg)),
                                 self.progress, mask_exploits=self.cfg.mask_exploits)  # fmt: skip
        self.recorder.on_abort(self.dispatcher.cancel)
        self.spend = RunSpend(self.cfg.prices, self.cfg.budget, self.cfg.repeats)
        """Each line's cost and fingerprint id, and the run's budget (``collect.budget``)."""
        self.spend.on_cap = self._at_cap
        self.ledger.stamp = self.spend.stamp
        self.watch = RunWatch()
        """What the run shows while it runs (``/metrics``, the progress bar's status line)."""
        self.recorder.listeners.append(self.watch)
        self.undeclared = UndeclaredTools(
            [n for n, s in run.config.servers.items() if s.impl == "tool_agent"]
        )
        """Rollouts whose model called tools their rows do not declare (warned about)."""
        self.recorder.listeners.append(self.undeclared)
        self.sections: Callable[[], dict[str, Any]] = dict
        """More sections for ``metrics.json`` (the launcher's report: restarts...)."""
        self._started = False
        self._abandoned_at_cap = False
        self._task_environments: tuple[list[str] | None] | None = None

    @property
    def abort_reason(self) -> str | None:
        return self.recorder.abort_reason

    def abort(self, reason: str) -> None:
        """Stop dispatching and cancel in-flight rollouts (they stay pending for --resume)."""
        self.recorder.abort(reason)

    def in_flight(self) -> int | None:
        """The rollouts being run now (``None``: the dispatcher does not know)."""
        return self.dispatcher.in_flight

    async def start(self) -> None:
        """Get the dispatcher ready (Ray: start the worker actors). A failure here means the
        run never started."""
        if not self._started:
            # A row without a field its environment requires fails every rollout of it at
            # verify time, after its model calls: refuse the file before any is made.
            await check_rows(
                self.run.config, self.route, Path(self.run.info.path), self.run.info.tasks,
                self._health, self.run.dialects,
            )  # fmt: skip
            await self.dispatcher.start(self.client, self.targets)
            self._started = True

    def pending(self) -> Iterator[RolloutItem]:
        """The rollouts of ``tasks.jsonl`` that have no record yet, in order; none once the
        run's budget is spent."""
        dialects = self.run.dialects
        for task_index, rollout_index, raw in iter_rollouts(self.run.files.tasks):
            if self.spend.stop_reason is not None:
                return
            if not self.ledger.is_done(task_index, rollout_index):
                prior = self.ledger.attempts_so_far(task_index, rollout_index)
                yield dialects.item(task_index, rollout_index, raw, self.route, prior)

    def _environments(self) -> list[str] | None:
        """Each task's environment, by task index (``metrics.json``'s ``by_environment``): the
        resources server its agent verifies with (an environment server stands for itself).
        None when one server runs every row (nothing to break down)."""
        if self._task_environments is not None:  # read once a run: at its start
            return self._task_environments[0]
        if len(self.targets) < 2:
            return None
        envs: dict[str, str] = {}
        out: list[str] = []
        for task_index, rollout_index, raw in iter_rollouts(self.run.files.tasks):
            if rollout_index != 0:
                continue
            server = self.run.dialects.item(task_index, 0, raw, self.route, 0).agent
            if server not in envs:
                kind = self.run.config.servers[server].kind
                envs[server] = server if kind != "agent" else resources_of(self.run.config, server)
            out.extend([""] * (task_index + 1 - len(out)))
            out[task_index] = envs[server]
        return out

    async def execute(self) -> RunOutcome:
        """Dispatch every pending rollout, then write metrics and ``run.json``."""
        started, cpu_started = time.monotonic(), time.process_time()
        try:
            await self.start()
            await self._record_code()
            await self._record_fingerprints()
            await self._warn_unread_fields()
            self._warn_unscripted()
            self._watch_environments()
            self.ledger.load(self.cfg.max_rollout_attempts)
            self.spend.load(self.run.out_dir)
            self.ledger.open()
            with _abort_on_signals(self.abort):
                try:
                    self.progress.start(
                        self.run.total, done=self.ledger.succeeded + self.ledger.failed
                    )
                    # The status line under the bar, while someone watches it (a terminal).
                    self.watch.watch_hops = self.progress.watched
                    self.watch.start_live(self.progress, self.client, self.urls, self.in_flight)
                    if self.ledger.pending:
                        await self.dispatcher.dispatch(
                            self.pending(), self.ledger.pending, self.recorder
                        )
                        stopped = self.recorder.aborted or self.spend.stop_reason is not None
                        if self.ledger.pending and not stopped:
                            self.abort("rollouts were left without a record (every worker "
                                       "died?); finish the run with --resume")  # fmt: skip
                finally:
                    await self.watch.stop_live()
                    self.progress.stop()
                    self.ledger.close()
            if (undeclared := self.undeclared.summary()) is not None:
                self.run.run_info.setdefault("warnings", []).append(undeclared)
            cpu = time.process_time() - cpu_started
            return await self._finish(time.monotonic() - started, cpu)
        finally:
            await self.close()

    async def close(self) -> None:
        """Release what the run held (the dispatcher's workers, the HTTP client if ours)."""
        try:
            await self.dispatcher.close()
        finally:
            if self._own_client:
                await self.client.close()

    async def _finish(self, wall: float, cpu: float) -> RunOutcome:
        run = self.run
        # The outcome is decided when dispatch ends: an abort raised while the final stats are
        # gathered (the watchdog seeing a server die under /aggregate_metrics) must not turn a
        # run with every rollout recorded into an aborted one.
        aborted, reason = self.recorder.aborted, self.abort_reason
        metrics = compute_metrics(
            run.out_dir, run.total, self.cfg.repeats, self.cfg.pass_threshold,
            groups=self._environments(),
        )  # fmt: skip
        data = metrics.to_dict()
        data["pass_threshold"] = self.cfg.pass_threshold
        done = self.recorder.recorded
        data["timing"] = {
            "wall_seconds": round(wall, 3),
            "rollouts_this_session": done,
            "rollouts_per_second": round(done / wall, 2) if wall > 0 else None,
            # This process's CPU while it dispatched (with an agent in process, the agent's
            # too): what collecting cost here, start-up and reports left out.
            "cpu_seconds": round(cpu, 3),
        }
        report = await self.dispatcher.report()
        spend = self.spend
        if report.abandoned is not None and self._abandoned_at_cap:
            spend.abandoned = report.abandoned  # counted by the dispatcher once work stopped
        own = {name: vars(s) for name, s in self.client.stats().items()}
        data["http"] = _merge_counters([own, *report.http])
        data["servers"] = await self._server_stats()
        data["dispatch"] = {"circuit_holds": report.circuit_holds, "failovers": report.failovers}
        data.update(report.sections)
        data.update(self.sections())
        if not aborted:
            data["env_aggregate"] = await self._env_aggregate()
        ledger = spend.ledger.to_dict(self.cfg.prices, spend.abandoned)
        write_json(run.files.cost, ledger)
        data["cost"] = ledger
        write_json(run.files.metrics, data)
        pending = metrics.total - metrics.succeeded - metrics.failed
        budget_stop = spend.stop_reason is not None and not aborted
        if budget_stop and pending:
            # Stopped cleanly at its cap: what is recorded is kept, --resume (with a larger
            # budget) runs the rest.
            status, code, reason = "stopped_at_budget", EXIT_BUDGET, spend.stop_reason
        elif aborted or pending:
            status, code = "aborted", EXIT_ABORTED
        elif metrics.failed:
            status, code = "completed_with_failures", EXIT_SOME_FAILED
        else:
            status, code = "completed", EXIT_OK
        ended = dict(report.sections)
        if spend.stop_reason is not None:
            ended["budget"] = spend.summary(pending)
        if aborted:
            assert self.recorder.budget is not None
            ended["abort"] = {"reason": reason, **self.recorder.budget.summary.to_dict()}
        mark_finished(run, status, code, **ended)
        return RunOutcome(status, code, data, run.out_dir, reason)

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

    async def _health(self, name: str) -> dict[str, Any] | None:
        """Server ``name``'s ``/health`` answer; ``None`` if it gives none (not every server has
        that endpoint). Once, briefly: it informs, it never holds a run up."""
        if name not in self.urls or name not in self.run.config.servers:
            return None
        once = RetryPolicy(max_attempts=1, attempt_timeout=5.0)
        target = Target(f"{name}.health", tuple(self.urls[name]), once)
        try:
            return await self.client.call(target, "/health", {}, deadline=5.0)
        except RollgymError:
            return None

    async def _record_code(self) -> None:
        """Which code every replica of every server runs, as each says (``/health``'s
        ``code``: what it imported, not what this process would find), into ``run.json``."""
        once = RetryPolicy(max_attempts=1, attempt_timeout=5.0)
        names = [n for n in self.run.config.servers if n in self.urls]
        asks = [(name, url) for name in names for url in self.urls[name]]

        async def ask(name: str, url: str) -> LoadedCode | None:
            target = Target.single(f"{name}.health", url, once)
            try:
                health = await self.client.call(target, "/health", {}, deadline=5.0)
            except RollgymError:
                return None
            return LoadedCode.from_dict(health.get("code")) if isinstance(health, dict) else None

        said = await asyncio.gather(*(ask(name, url) for name, url in asks))
        replicas: dict[str, list[LoadedCode | None]] = {name: [] for name in names}
        for (name, _), code in zip(asks, said, strict=True):
            replicas[name].append(code)
        mark_code(self.run, replicas)

    async def _record_fingerprints(self) -> None:
        """Every resources server's fingerprint, into ``run.json`` (``fingerprints``), once per
        session; each record names its environment's by id (``rollgym.collect.provenance``)."""
        found, warnings = await ask_fingerprints(self.client, self.run.config, self.urls)
        info = self.run.run_info
        info["fingerprints"] = found
        if warnings:
            info.setdefault("warnings", []).extend(warnings)
        write_json(self.run.files.run_json, info)
        ids = {name: said.get("id") for name, said in found.items()}
        self.spend.fingerprint_of = lambda i: ids.get(self.watch.environment_of(i))

    def _at_cap(self, reason: str) -> None:
        """The run's budget is spent: no more rollouts are sent; those in flight finish, or
        are cancelled (``in_flight: abandon``) and left for ``--resume``: ``abandoned``, the
        rollouts started and not recorded (a dispatcher that knows only once they stopped,
        Ray's, says it in its report)."""
        log.warning("stopping at the run's budget: %s", reason)
        budget = self.cfg.budget
        if budget is not None and budget.in_flight == "abandon":
            self._abandoned_at_cap = True  # not an abort's cancel: ``_finish``
            self.spend.abandoned = self.in_flight() or 0
            self.dispatcher.cancel()

    def _watch_environments(self) -> None:
        """Name each task's environment for the live reward metric (``RunWatch.rewards``):
        a server name of the config, so the metric's labels stay bounded."""
        envs = self._environments()
        self._task_environments = (envs,)
        if envs is not None:
            self.watch.environment_of = lambda i: (envs[i] if i < len(envs) else "") or "unknown"
            return
        server = self.agent_name or next(iter(self.targets), "unknown")
        one = server
        if server in self.run.config.servers and self.run.config.servers[server].kind == "agent":
            with contextlib.suppress(ConfigError):  # an agent given by url: named for itself
                one = resources_of(self.run.config, server)
        self.watch.environment_of = lambda i: one

    def _warn_unscripted(self) -> None:
        """Warn, once per run, about rows the scripted model has no script for (they score 0
        and nothing fails: ``collect.unscripted``)."""
        message = unscripted_warning(self.run.config, self.run.files.tasks)
        if message is not None:
            log.warning("%s", message)
            self.run.run_info.setdefault("warnings", []).append(message)

    async def _warn_unread_fields(self) -> None:
        """Warn, once per run, about the task rows' fields that neither rollgym nor any server
        of the run declares it reads (``row_fields`` in ``/health``): a field nobody reads may
        be a misspelt one the verifier needed. A server with no rollgym ``/health`` (NeMo
        Gym's, any other foreign one) may read any field: then nothing can be said, and
        nothing is."""
        fields = self.run.info.fields - ROLLGYM_ROW_FIELDS
        if not fields:
            return
        names = [
            n for n, s in self.run.config.servers.items()
            if s.kind in ("agent", "resources", "environment") and n in self.urls
        ]  # fmt: skip
        answers = await asyncio.gather(*(self._health(n) for n in names))
        if any(health is None or "row_fields" not in health for health in answers):
            return  # a foreign server's reads are unknown: a warning would be a guess
        declared: set[str] = set()
        silent = []
        for name, health in zip(names, answers, strict=True):
            read = health.get("row_fields") if health else None
            if isinstance(read, list):
                declared.update(str(f) for f in read)
            elif self.run.config.servers[name].kind == "resources":
                silent.append(name)
        unread = sorted(fields - declared)
        if not unread:
            return
        shown = ", ".join(unread[:20]) + (
            f" and {len(unread) - 20} more" if len(unread) > 20 else ""
        )
        message = f"task rows carry fields that no server of the run says it reads: {shown}"
        if silent:
            message += (
                f" (resources server(s) {', '.join(silent)} do not declare the fields they "
                "read: ResourcesServer.row_fields)"
            )
        log.warning("%s", message)
        self.run.run_info.setdefault("warnings", []).append(message)

    async def _env_aggregate(self) -> dict[str, Any]:
        """The environment's metrics over the run (``/aggregate_metrics`` of the agent's
        resources server): ``agent_metrics`` and ``key_metrics`` go to ``metrics.json``; all of
        it, per-task metrics too, to ``rollouts_aggregate_metrics.json``. Only asked of an
        environment that has metrics of its own."""
        agent = self.agent_name
        if agent is None or self.run.config.servers[agent].kind != "agent":
            return {}  # no one agent, or an environment server: no resources of ours
        try:
            res_name = resources_of(self.run.config, agent)
        except ConfigError:
            return {}  # an agent given by url, verifying with no server of this config
        if res_name not in self.urls:
            return {}
        health = await self._health(res_name)
        if health is None or "aggregate_metrics" not in (health.get("features") or []):
            return {}  # the environment has none: do not ship every rollout to it
        target = Target(
            res_name, tuple(self.urls[res_name]), self.run.config.servers[res_name].retry
        )
        try:
            answer = await self.client.call(
                target, "/aggregate_metrics", self._verify_responses(), deadline=60
            )
            result = AggregateMetrics.model_validate(answer)
        except RollgymError as err:
            log.warning("aggregate_metrics failed: %s", err)
            return {"error": err.to_dict()}
        except ValidationError as exc:
            bad = ProtocolError(
                format_validation_error("not NeMo Gym's AggregateMetrics", exc, one_line=True),
                server=res_name, endpoint="/aggregate_metrics",
            )  # fmt: skip
            log.warning("aggregate_metrics failed: %s", bad)
            return {"error": bad.to_dict()}
        entry = {"agent_ref": {"name": agent}, **result.model_dump()}
        write_json(self.run.files.aggregate, [entry])
        return {"agent_metrics": result.agent_metrics, "key_metrics": result.key_metrics}

    def _verify_responses(self) -> bytes:
        """``{"verify_responses": [...]}`` of the recorded rollouts, built as bytes one compact
        record at a time: as a list of dicts it would be the largest object of the whole run.
        Scalars only (reward, metrics, indices, short task fields) and ``response.usage``; the
        response and the inputs stay out."""
        body = bytearray(b'{"verify_responses":[')
        count = 0
        for got in self.run.files.successes():
            rec = got.record
            slim = {k: v for k, v in rec.items() if _is_scalar(v)}
            response = rec.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                slim["response"] = {"usage": usage}
            body += orjson.dumps(slim)
            body += b","
            count += 1
            if count >= AGGREGATE_MAX_ROLLOUTS:
                break
        if count:
            body.pop()  # the last comma
        body += b"]}"
        return bytes(body)


@contextlib.contextmanager
def _abort_on_signals(abort: Any) -> Iterator[None]:
    """Ctrl-C / SIGTERM abort the run cleanly (records kept, in-flight ones left pending)."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, abort, f"interrupted by {signal.Signals(sig).name}")
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _merge_counters(parts: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """Per-server call counters of several HTTP clients, added up."""
    merged: dict[str, dict[str, int]] = {}
    for part in parts:
        for name, counters in part.items():
            into = merged.setdefault(name, {})
            for key, value in counters.items():
                into[key] = into.get(key, 0) + value
    return merged


def _is_scalar(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (bool, int, float))
        or (isinstance(value, str) and len(value) <= 256)
    )
