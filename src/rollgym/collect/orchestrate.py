"""One run, start to end, for every way of running one: ``rollgym run`` (servers launched
here), ``rollgym collect`` (servers already running) and ``rollgym run --ray`` (servers and
workers on a cluster). Only the launcher and the dispatcher differ:

    check the agent -> prepare the run directory -> launcher.start() -> dispatcher.start()
        -> collect -> launcher.stop()

A run whose servers or workers never came up is marked ``failed_to_start`` in ``run.json``
(nothing was dispatched, and a plain rerun into the same directory is allowed); so is one
interrupted (Ctrl-C, SIGTERM) during start-up, at once, before the servers are stopped. The run
holds its directory's lock (``rundir.RunLock``) from preparation to its last write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from rollgym.collect.collector import Collector
from rollgym.collect.dispatch import Dispatcher
from rollgym.collect.inprocess import InProcessAgents, in_process_agents
from rollgym.collect.rundir import (
    PreparedRun,
    RunOutcome,
    mark_aborted,
    mark_failed_to_start,
    prepare_run,
)
from rollgym.config import CollectConfig, Config, RetryPolicy
from rollgym.errors import ConfigError, LaunchError, RollgymError, RunAborted, TransportError
from rollgym.http import HttpClient, Target

log = logging.getLogger("rollgym.collect")


class Launcher(Protocol):
    """Brings a run's servers up and down."""

    async def start(self) -> dict[str, list[str]]:
        """Start (or find) the servers; return name -> replica URLs once all answer."""

    async def stop(self) -> None:
        """Stop what ``start`` started; idempotent, safe after a failed start."""

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        """While the run collects (cancelled at its end): keep the servers up, calling
        ``pause(True)`` / ``pause(False)`` around a repair; ``on_fatal(reason)`` when they
        cannot be kept up (the run then aborts)."""

    def report(self) -> dict[str, Any]:
        """What the launcher did during the run, for ``metrics.json`` (``{}``: nothing)."""


async def run_collection(
    config: Config,
    collect: CollectConfig,
    input_path: Path,
    out_dir: Path,
    launcher: Launcher,
    *,
    dispatcher: Dispatcher | None = None,
    resume: bool = False,
    agent: str | None = None,
    progress: bool = True,
) -> RunOutcome:
    """Run (or ``resume``) one collection into ``out_dir`` with servers from ``launcher``.
    With ``collect.agent_in_process`` the agents run here (``InProcessAgents``); ``launcher``
    must then leave them out (``Supervisor(skip=...)``)."""
    agent_name = config.agent_name(agent)  # pre-flight: fails before anything is written
    if collect.agent_in_process:
        if dispatcher is not None:
            raise ConfigError(
                "collect.agent_in_process runs the agents in the collector's process; it "
                "does not combine with another dispatcher (--ray)"
            )
        launcher = InProcessAgents(launcher, config, in_process_agents(config))
    prepared = prepare_run(config, collect, input_path, out_dir, resume=resume, lock=True)
    try:
        try:
            collector = await _start(prepared, launcher, dispatcher, agent_name, progress)
            collector.sections = launcher.report
            watch = asyncio.create_task(launcher.watch(collector.abort, collector.recorder.pause))
            watch.add_done_callback(lambda task: _watch_ended(task, collector))
            try:
                return await collector.execute()
            except BaseException as exc:
                # The collector writes how a run ended, signals included; this covers what
                # reaches past it (a signal before its handlers are set, a crash).
                mark_aborted(prepared, _why_stopped(exc))
                raise
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
        finally:
            await launcher.stop()
    finally:
        prepared.release()


def _why_stopped(exc: BaseException) -> str:
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return "interrupted"
    return f"stopped by an error: {exc}" if isinstance(exc, RollgymError) else f"crashed: {exc!r}"


async def _start(
    prepared: PreparedRun,
    launcher: Launcher,
    dispatcher: Dispatcher | None,
    agent: str,
    progress: bool,
) -> Collector:
    """Servers up, dispatcher ready: the collector to run; or the run marked as never
    started, and the reason raised."""
    t0 = time.monotonic()
    collector: Collector | None = None
    with _interrupts_stop_startup(prepared) as interrupted:
        try:
            urls = await launcher.start()
            if agent not in urls:
                raise ConfigError(
                    f"no URL for agent {agent!r}: pass --servers {agent}=URL or set "
                    f"servers.{agent}.url in {prepared.config.source or 'the config'}"
                )
            client = (
                HttpClient(transport=launcher.transport)
                if isinstance(launcher, InProcessAgents)
                else None
            )
            collector = Collector(
                prepared, urls, agent=agent, progress=progress, dispatcher=dispatcher,
                client=client,
            )  # fmt: skip
            await collector.start()
        except BaseException as exc:
            if collector is not None:
                await collector.close()
            if interrupted:
                err: RollgymError = RunAborted(interrupted[0])
                _uncancel()
            elif isinstance(exc, RollgymError):
                err = exc
            elif isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
                err = RunAborted("interrupted during start-up; nothing was dispatched")
            else:
                err = RunAborted(f"start-up stopped: {exc!r}")
            mark_failed_to_start(prepared, err)
            if interrupted:
                raise err from None
            raise
    prepared.run_info["startup_seconds"] = round(time.monotonic() - t0, 3)
    return collector


@contextlib.contextmanager
def _interrupts_stop_startup(prepared: PreparedRun) -> Iterator[list[str]]:
    """During start-up, SIGINT/SIGTERM mark the run ``failed_to_start`` at once and cancel the
    start (which stops what it started): stopping servers can take their grace period, and a
    user who saw nothing happen would press Ctrl-C again or kill the run with ``run.json``
    still saying "running". Yields the reason once a signal came."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    reasons: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if reasons:
            log.warning("%s again: still stopping the servers (SIGKILL after their grace)",
                        sig.name)  # fmt: skip
            return
        reasons.append(f"interrupted by {sig.name} during start-up; nothing was dispatched")
        mark_failed_to_start(prepared, RunAborted(reasons[0]))
        log.warning("%s: stopping the servers", reasons[0])
        if task is not None:
            task.cancel()

    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not in the main thread (or not on Unix): start-up keeps the default handling.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        yield reasons
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _uncancel() -> None:
    # We cancelled our own task to stop start-up; the run goes on to report it as an error,
    # so the cancellation must not linger (a later ``asyncio.timeout`` would misread it).
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class RunningServers:
    """Servers that run elsewhere (``rollgym collect``): ``start`` only checks that each one
    answers at all, so a wrong URL fails the run before anything is dispatched."""

    def __init__(self, urls: dict[str, list[str]], *, timeout: float = 10.0) -> None:
        self.urls = urls
        self.timeout = timeout

    async def start(self) -> dict[str, list[str]]:
        async with HttpClient(limit=64) as http:
            await check_reachable(http, self.urls, self.timeout)
        return self.urls

    async def stop(self) -> None:
        """Nothing to stop: the servers are not ours."""

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        """Nothing to watch: servers that are not ours are not restarted by us."""

    def report(self) -> dict[str, Any]:
        return {}


# Refused connections are retried until the deadline: a server started a moment ago (``serve &``
# then ``collect``) gets the time to bind. Any status is an answer, so none is retried.
_PROBE = RetryPolicy.model_validate(
    {
        "max_attempts": 10, "attempt_timeout": 5.0, "deadline": 10.0, "backoff_initial": 0.2,
        "backoff_max": 1.0, "retry_statuses": [], "budget": {"enabled": False},
        "breaker": {"enabled": False},
    }
)  # fmt: skip


async def check_reachable(
    http: HttpClient, urls: dict[str, list[str]], timeout: float = 10.0
) -> None:
    """Raise ``LaunchError`` naming every server replica that does not answer HTTP within
    ``timeout`` seconds. Any HTTP answer counts (a server without ``/health`` answers 404):
    the question is whether something listens, not whether it is a rollgym server."""
    probes = [
        (name, url, Target.single(name, url, _PROBE)) for name, us in urls.items() for url in us
    ]
    problems: list[str] = []
    results = await asyncio.gather(
        *(http.call(t, "/health", {}, deadline=timeout) for _, _, t in probes),
        return_exceptions=True,
    )
    for (name, url, _), got in zip(probes, results, strict=True):
        if isinstance(got, TransportError):
            problems.append(f"{name} at {url}: {got.message}")
        elif isinstance(got, BaseException) and not isinstance(got, RollgymError):
            raise got
    if problems:
        raise LaunchError(
            f"{len(problems)} server(s) not reachable: " + "; ".join(problems), retryable=False
        )


def _watch_ended(task: asyncio.Task[None], collector: Collector) -> None:
    """A launcher's watch that crashed must stop the run, not leave it unwatched in silence."""
    if task.cancelled() or task.exception() is None:
        return
    collector.abort(f"the server watchdog crashed: {task.exception()!r}")
