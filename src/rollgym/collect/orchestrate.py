"""One run, start to end, for every way of running one: ``rollgym run`` (servers launched
here), ``rollgym collect`` (servers already running) and ``rollgym run --ray`` (servers and
workers on a cluster). Only the launcher and the dispatcher differ; the caller builds the
launcher (``collect.launchers``, where the pre-flight of the servers it launches runs, before
this is called):

    resolve the agents (launchers.RunAgents) -> prepare the run directory -> launcher.start()
        -> dispatcher.start() -> collect -> launcher.stop()

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
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollgym import tracing
from rollgym.collect.collector import Collector
from rollgym.collect.dialect import Dialects, RowDialect
from rollgym.collect.dispatch import Dispatcher
from rollgym.collect.launchers import InProcessAgents, Launcher, RunAgents
from rollgym.collect.rundir import (
    PreparedRun,
    RunOutcome,
    mark_aborted,
    mark_failed_to_start,
    prepare_run,
    write_json,
)
from rollgym.collect.scrape_targets import TargetsFile, WorkerMetrics
from rollgym.config import CollectConfig, Config
from rollgym.errors import ConfigError, RollgymError, RunAborted
from rollgym.extras import install_command
from rollgym.http import HttpClient

if TYPE_CHECKING:
    from rollgym.collect.metrics_port import CollectorMetrics

log = logging.getLogger("rollgym.collect")


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
    agents: RunAgents | None = None,
    progress: bool = True,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    agent_dialects: tuple[Any, ...] = (),
    dialects: Iterable[RowDialect] = (),
) -> RunOutcome:
    """Run (or ``resume``) one collection into ``out_dir`` with servers from ``launcher``.
    ``agents``: the run's agents as the caller resolved them (default: from ``agent`` and
    ``collect``). With ``collect.agent_in_process`` the agents run here (``InProcessAgents``,
    speaking ``agent_dialects``); ``launcher`` must then leave them out (``local_launcher``
    does). ``dialects``: the row shapes the run speaks besides the flat row (the entry point's
    ``rollgym.dialects``)."""
    # Pre-flight, before anything is written: traces if asked for (rollgym.tracing), the agent,
    # and whether it runs here.
    tracing.setup("rollgym-collector")
    agents = agents or RunAgents.of(config, collect, agent, dispatcher)
    in_process: InProcessAgents | None = None
    if agents.in_process:
        launcher = in_process = InProcessAgents(launcher, config, agents.in_process, agent_dialects)
    # ``metrics_port``: the collector's Prometheus metrics there (0: a port the OS picks), its
    # URL printed and recorded in run.json as ``metrics_url``. Bound before anything is
    # written: a port in use fails the run at once.
    metrics = _collector_metrics(metrics_host, metrics_port) if metrics_port is not None else None
    targets: TargetsFile | None = None
    try:
        prepared = prepare_run(
            config, collect, input_path, out_dir, resume=resume, lock=True,
            dialects=Dialects(dialects),
        )  # fmt: skip
    except BaseException:
        if metrics is not None:
            await metrics.server.close()
        raise
    try:
        try:
            if metrics is not None:
                await metrics.server.start()
                print(f"collector metrics: {metrics.url}", file=sys.stderr, flush=True)
                prepared.run_info["metrics_url"] = metrics.url
                write_json(prepared.files.run_json, prepared.run_info)
            client = None if in_process is None else HttpClient(transport=in_process.transport)
            collector = await _start(prepared, launcher, dispatcher, agents, client, progress)
            if metrics is not None:
                metrics.attach(collector)
                targets = _scrape_targets(prepared, collector, metrics.url, dispatcher)
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
        if targets is not None:
            targets.remove()
        if metrics is not None:
            await metrics.server.close()
        prepared.release()


def _scrape_targets(
    prepared: PreparedRun, collector: Collector, url: str, dispatcher: Dispatcher | None
) -> TargetsFile:
    """``scrape_targets.json``: every process of the run that serves metrics (the collector,
    the servers rollgym runs, the Ray workers), for Prometheus's ``file_sd``; named in
    run.json as ``scrape_targets``."""
    config = prepared.config.servers
    servers = {n: u for n, u in collector.urls.items() if n in config and config[n].url is None}
    workers = dispatcher if isinstance(dispatcher, WorkerMetrics) else None
    targets = TargetsFile(prepared.out_dir, url, servers, workers)
    targets.write()
    prepared.run_info["scrape_targets"] = targets.path.name
    write_json(prepared.files.run_json, prepared.run_info)
    return targets


def _collector_metrics(host: str, port: int) -> CollectorMetrics:
    """The collector's metrics server, bound (not yet serving)."""
    try:
        from rollgym.collect.metrics_port import CollectorMetrics
    except ImportError as exc:
        raise ConfigError(
            f"--metrics-port needs prometheus_client ({install_command('metrics')}): {exc}"
        ) from None
    return CollectorMetrics(host, port)


def _why_stopped(exc: BaseException) -> str:
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return "interrupted"
    return f"stopped by an error: {exc}" if isinstance(exc, RollgymError) else f"crashed: {exc!r}"


async def _start(
    prepared: PreparedRun,
    launcher: Launcher,
    dispatcher: Dispatcher | None,
    agents: RunAgents,
    client: HttpClient | None,
    progress: bool,
) -> Collector:
    """Servers up, dispatcher ready: the collector to run; or the run marked as never
    started, and the reason raised."""
    t0 = time.monotonic()
    collector: Collector | None = None
    with _interrupts_stop_startup(prepared) as interrupted:
        try:
            urls = await launcher.start()
            RunAgents(agents.default).require_url(urls, prepared.config)
            collector = Collector(
                prepared, urls, agent=agents.default, progress=progress, dispatcher=dispatcher,
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


def _watch_ended(task: asyncio.Task[None], collector: Collector) -> None:
    """A launcher's watch that crashed must stop the run, not leave it unwatched in silence."""
    if task.cancelled() or task.exception() is None:
        return
    collector.abort(f"the server watchdog crashed: {task.exception()!r}")
