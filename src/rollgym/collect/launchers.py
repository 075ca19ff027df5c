"""Where a run's servers come from, and which agent runs its rows: decided here, once.

    RunAgents.of(config, collect, --agent)   the default agent, resolved once; the agents
                                             built in the collector's process, chosen once
    local_launcher(...)                      rollgym run: Supervisor (launch/); rollgym
                                             collect: RunningServers (found running)
    InProcessAgents (inprocess.py)           wraps either, for the in-process agents
    RayLauncher (ray/run.py)                 rollgym run --ray: servers on a cluster

Every launcher answers the ``Launcher`` protocol; ``run_collection`` takes any of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rollgym.collect.inprocess import in_process_agents
from rollgym.config import CollectConfig, Config, RetryPolicy
from rollgym.errors import ConfigError, LaunchError, RollgymError, TransportError
from rollgym.http import HttpClient, Target

if TYPE_CHECKING:
    from rollgym.collect.dispatch import Dispatcher


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


@dataclass(frozen=True)
class RunAgents:
    """Which agents a run uses: ``name`` runs every row that names no other (``--agent``, else
    ``collect.agent``, else the config's only agent); ``in_process`` are built in the
    collector's process (``collect.agent_in_process``), not launched."""

    name: str
    in_process: tuple[str, ...] = ()

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
        name = config.agent_name(agent or collect.agent)
        if not collect.agent_in_process:
            return cls(name)
        if dispatcher is not None:
            raise ConfigError(
                "collect.agent_in_process runs the agents in the collector's process; it "
                "does not combine with another dispatcher (--ray)"
            )
        return cls(name, tuple(in_process_agents(config)))

    def require_url(self, urls: Container[str], config: Config) -> None:
        """Raise ``ConfigError`` unless the run's agent is among the servers with a URL
        ``urls`` (or runs in process)."""
        if self.name not in urls and self.name not in self.in_process:
            raise ConfigError(
                f"no URL for agent {self.name!r}: pass --servers {self.name}=URL or set "
                f"servers.{self.name}.url in {config.source or 'the config'}"
            )


def local_launcher(
    config: Config,
    agents: RunAgents,
    *,
    urls: dict[str, list[str]] | None = None,
    log_dir: Path | None = None,
    log_level: str = "WARNING",
) -> Launcher:
    """``rollgym run``'s launcher (``urls`` None: the config's servers started here, but the
    agents in process) or ``rollgym collect``'s (``urls``: servers already running, the agent's
    URL checked before anything is written)."""
    if urls is None:
        from rollgym.launch import Supervisor  # the launcher's imports, only for a launch

        return Supervisor(config, log_dir=log_dir, log_level=log_level, skip=agents.in_process)
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
