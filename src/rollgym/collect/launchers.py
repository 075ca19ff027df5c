"""Where a run's servers come from, and which agent runs its rows: decided here, once. Every
launcher answers the ``Launcher`` protocol; ``run_collection`` takes any of them. They live
here, but the one for Ray, which lives with Ray (collection sits below it):

    RunAgents.of(config, collect, --agent)   the default agent, resolved once; the agents
                                             built in the collector's process, chosen once
    local_launcher(...)                      rollgym run: Supervisor (launch/); rollgym
                                             collect: RunningServers (found running)
    InProcessAgents                          wraps either, for the in-process agents
    ResourcesOnly                            rollgym reverify: the resources server alone
    ray.launcher.ray_launcher(...)           rollgym run --ray: RayServers on a cluster

The pre-flight of the servers a run launches (``check_servers``: every impl imports, every
option is valid) runs once, where the launcher is built: before anything is written or
started. The launcher is then told so (``checked=True``); built any other way, a
``Supervisor`` or ``RayServers`` runs the check itself when it starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from rollgym.collect.peers import peers_of
from rollgym.config import CollectConfig, Config, RetryPolicy
from rollgym.errors import ConfigError, LaunchError, RollgymError, TransportError
from rollgym.http import HttpClient, Target
from rollgym.http.default import default_transport
from rollgym.http.inprocess import InProcessTransport, inprocess_url
from rollgym.launch.timeouts import WARMUP_TIMEOUT
from rollgym.server.app import build_app
from rollgym.server.base import BaseServer, ServerContext, check_servers, resolve_impl
from rollgym.wire import HEALTH_FAILED, HEALTH_STARTING

if TYPE_CHECKING:
    from rollgym.collect.dispatch import Dispatcher

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


# -- the run's agents --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAgents:
    """Which agents a run uses: ``default`` runs every row that names no other (``--agent``,
    else ``collect.agent``, else the config's only agent or environment server; ``None`` when
    the config has several and names none: every row then names its own server, checked line
    by line); ``in_process`` are built in the collector's process
    (``collect.agent_in_process``), not launched."""

    default: str | None
    in_process: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The default agent, which the caller needs (``ConfigError`` if there is none)."""
        if self.default is None:
            raise ConfigError("name the agent to run with --agent (the config has several)")
        return self.default

    @classmethod
    def of(
        cls,
        config: Config,
        collect: CollectConfig,
        agent: str | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> RunAgents:
        """Resolve the run's agents; ``ConfigError`` (before anything is written) for an
        unknown agent, or agents in process with another ``dispatcher`` (Ray)."""
        name = config.default_dispatcher(agent or collect.agent)
        if not collect.agent_in_process:
            return cls(name)
        if dispatcher is not None:
            raise ConfigError(
                "collect.agent_in_process runs the agents in the collector's process; it "
                "does not combine with another dispatcher (--ray)"
            )
        return cls(name, tuple(in_process_agents(config)))

    def require_url(self, urls: Container[str], config: Config) -> None:
        """Raise ``ConfigError`` unless the run's default agent (if it has one) is among the
        servers with a URL ``urls`` (or runs in process)."""
        name = self.default
        if name is not None and name not in urls and name not in self.in_process:
            raise ConfigError(
                f"no URL for agent {name!r}: pass --servers {name}=URL or set "
                f"servers.{name}.url in {config.source or 'the config'}"
            )


def in_process_agents(config: Config) -> list[str]:
    """The agents a run would launch (every agent server without a ``url:``)."""
    return [n for n, s in config.servers.items() if s.kind == "agent" and not s.url]


# -- rollgym run, rollgym collect --------------------------------------------------------------


def local_launcher(
    config: Config,
    agents: RunAgents,
    *,
    urls: dict[str, list[str]] | None = None,
    log_dir: Path | None = None,
    log_level: str = "WARNING",
) -> Launcher:
    """``rollgym run``'s launcher (``urls`` None: the config's servers started here, but the
    agents in process; checked first) or ``rollgym collect``'s (``urls``: servers already
    running, the agent's URL checked). Either way before anything is written."""
    if urls is None:
        from rollgym.launch import Supervisor  # the launcher's imports, only for a launch

        check_servers(config)  # the in-process agents too: they are built from it
        return Supervisor(
            config, log_dir=log_dir, log_level=log_level, skip=agents.in_process, checked=True
        )
    agents.require_url(urls, config)
    return RunningServers(urls)


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
    http: HttpClient,
    urls: dict[str, list[str]],
    timeout: float = 10.0,
    warmup_timeout: float = WARMUP_TIMEOUT,
) -> None:
    """Raise ``LaunchError`` naming every server replica that does not answer HTTP within
    ``timeout`` seconds. Any HTTP answer counts (a server without ``/health`` answers 404):
    the question is whether something listens, not whether it is a rollgym server. But a
    rollgym server that says its warm-up failed is not up, and one still warming (a scoring
    pool: ``starting``) is waited for, up to ``warmup_timeout`` seconds: the run reads its
    ``/health`` (code, the row fields it needs) at its start, which answers only once warm."""
    probes = [
        (name, url, Target.single(name, url, _PROBE)) for name, us in urls.items() for url in us
    ]
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    until = loop.time() + warmup_timeout
    told: set[str] = set()
    while probes:
        results = await asyncio.gather(
            *(http.call(t, "/health", {}, deadline=timeout) for _, _, t in probes),
            return_exceptions=True,
        )
        warming = []
        for probe, got in zip(probes, results, strict=True):
            name, url, _ = probe
            if isinstance(got, TransportError):
                problems.append(f"{name} at {url}: {got.message}")
            elif isinstance(got, RollgymError):
                # One answer is no "up": a server that says its warm-up failed (a scoring
                # pool) would fail every verify, after each rollout's model calls were paid.
                status, why = _health_state(got)
                if status == HEALTH_FAILED:
                    problems.append(f"{name} at {url}: its warm-up failed ({why})")
                elif status == HEALTH_STARTING:
                    warming.append(probe)
            elif isinstance(got, BaseException):
                raise got
        if warming and loop.time() >= until:
            problems += [
                f"{name} at {url}: still warming up after {warmup_timeout:g}s"
                for name, url, _ in warming
            ]
            break
        for name, url, _ in warming:
            if url not in told:
                told.add(url)
                log.info("waiting for %s at %s: it is warming up (its scoring pool)", name, url)
        probes = warming
        if probes:
            await asyncio.sleep(min(0.5, max(0.0, until - loop.time())))
    if problems:
        raise LaunchError(
            f"{len(problems)} server(s) not reachable: " + "; ".join(problems), retryable=False
        )


def _health_state(err: RollgymError) -> tuple[str | None, str]:
    """The state a ``/health`` error answer says (``HEALTH_FAILED``, ``HEALTH_STARTING``, or
    None for any other answer) and why. A body cut short by the error's bound still says it at
    its start (``status`` is the answer's first field)."""
    body = err.body or ""
    try:
        said = orjson.loads(body)
    except orjson.JSONDecodeError:
        said = None
    if isinstance(said, dict):
        status = said.get("status")
        if status not in (HEALTH_FAILED, HEALTH_STARTING):
            return None, ""
        return str(status), str(said.get("error") or "no reason given")
    for status in (HEALTH_FAILED, HEALTH_STARTING):
        if body.startswith(f'{{"status":"{status}"'):
            return status, "see its /health"
    return None, ""


# -- collect.agent_in_process ------------------------------------------------------------------


class InProcessAgents:
    """A launcher: ``inner`` brings up every server but ``names``, the agents, which are then
    built in the collector's process and served to it by ``transport``
    (``collect.agent_in_process``: one hop fewer).

    Every rollout is otherwise a ``POST /run`` to an agent process. Here ``/run`` is served to
    the collector through ``rollgym.http.inprocess`` (no socket, no HTTP parsing, no process).
    Everything the collector sees is unchanged: the same rollout records, error bodies,
    retries, circuit holds and deadlines, because it still calls the agent's app exactly as a
    server would serve it. The model and environment servers are reached over HTTP as before.

    The price: the agent's code runs on the collector's event loop. An agent that blocks the
    loop (CPU-heavy work in ``run``) stalls collection, and one that crashes the process ends
    the run (``--resume`` finishes it). A rollout's deadline cancels the agent's work in the
    collector's own task and waits for its clean-up (the calls it cancels), where over a socket
    the collector would give up at once and leave the clean-up to the agent: a rollout can end
    that much after its deadline. Not for ``--ray``, where workers already sit beside the
    agents."""

    def __init__(
        self,
        inner: Launcher,
        config: Config,
        names: Sequence[str],
        dialects: tuple[Any, ...] = (),
    ) -> None:
        self.inner = inner
        self.config = config
        self.names = list(names)
        self.dialects = dialects
        """What the agents speak beside rollgym's own protocol (``ServerContext.dialects``)."""
        self.servers: list[BaseServer] = []
        self.transport = InProcessTransport({}, default_transport())

    async def start(self) -> dict[str, list[str]]:
        urls = await self.inner.start()
        # An agent the inner launcher found running (``collect --servers agent=URL``) is used
        # there: a URL given by hand says where that agent is.
        self.names = [name for name in self.names if name not in urls]
        every = {**urls, **{name: [inprocess_url(name)] for name in self.names}}
        for name in self.names:
            cfg = self.config.servers[name]
            klass = resolve_impl(
                cfg.impl, cfg.kind, config_dir=self.config.base_dir(),
                where=f"{self.config.source or 'config'}: servers.{name}.impl",
            )  # fmt: skip
            server = klass(ServerContext.from_run(name, self.config, every, self.dialects))
            self.servers.append(server)  # before startup: a failed one is shut down too
            await server.startup()
            self.transport.apps[name] = build_app(server)
        return every

    async def stop(self) -> None:
        try:
            for server in self.servers:
                try:
                    await server.shutdown()
                except Exception:  # one agent's failed shutdown must not keep the others up
                    log.exception("in-process agent %s: shutdown failed", server.name)
            self.servers.clear()
            await self.transport.close()
        finally:
            await self.inner.stop()

    async def watch(
        self, on_fatal: Callable[[str], None], pause: Callable[[bool], None] | None = None
    ) -> None:
        await self.inner.watch(on_fatal, pause)

    def report(self) -> dict[str, Any]:
        return {**self.inner.report(), "agents_in_process": self.names}


# -- rollgym reverify --------------------------------------------------------------------------


class ResourcesOnly:
    """Starts only the resources server (and the peers its typed options name, e.g. a judge
    model) of a config, after checking the whole config (``rollgym reverify``'s pre-flight). The
    collector needs a URL for the run's agent: it is given the resources server's, since here
    the resources server is what turns a row into a verified rollout; nothing else of the agent
    is called."""

    def __init__(self, config: Config, agent: str, resources: str, log_dir: Path, level: str):
        from rollgym.launch import Supervisor  # the launcher's imports, only for a launch

        check_servers(config)
        names = {resources} | peers_of(config, resources)
        servers = {n: s for n, s in config.servers.items() if n in names}
        sub = Config.model_validate({"servers": servers, "source": config.source})
        self.agent, self.resources = agent, resources
        # Checked with the whole config: the servers kept, with the peers they name, are valid
        # on their own too.
        self.supervisor = Supervisor(sub, log_dir=log_dir, log_level=level, checked=True)

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
