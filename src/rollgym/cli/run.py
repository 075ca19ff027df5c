"""``rollgym run`` (start servers, collect, stop) and ``rollgym collect`` (running servers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from typer.core import TyperCommand

from rollgym.cli.args import http_url
from rollgym.errors import ConfigError, RunAborted

if TYPE_CHECKING:
    # Imported where used: `rollgym --help` must not pay for the collector, the launcher and
    # pydantic's schemas (a third of a second).
    from rollgym.collect import Launcher, RunOutcome
    from rollgym.collect.rundir import RecordedInputs
    from rollgym.config import CollectConfig, Config


class PlainHelpCommand(TyperCommand):
    """A command whose ``--help`` is click's plain layout. Rich's option table cuts long option
    names to fit the terminal (``--max-rollout-attem…`` at 80 columns), so a reader could not
    learn the option from the help; click's layout wraps the descriptions instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None


ConfigArg = Annotated[
    Path, typer.Argument(help="YAML config naming the servers and collect defaults.")
]
InputOpt = Annotated[
    Path | None,
    typer.Option("--input", "-i", help="Task file (JSONL). Default: collect.input of the config."),
]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Output directory of the run.")]
AgentOpt = Annotated[
    str | None,
    typer.Option(
        help="Agent server to run every row with, whatever its agent_ref names. Default: the "
        "row's agent_ref (mapped by collect.agent_aliases), else collect.agent or the only agent."
    ),
]
RepeatsOpt = Annotated[
    int | None, typer.Option(help="Rollouts per task (a GRPO group). Default: collect.repeats (1).")
]
ConcOpt = Annotated[
    int | None, typer.Option(help="Rollouts in flight at once. Default: collect.concurrency (64).")
]
LimitOpt = Annotated[int | None, typer.Option(help="Use only the first L tasks. Default: all.")]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Finish the run in --output: redo rollouts without a success record, never a "
        "success. The run's own input, --repeats and --limit are reused unless given.",
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(help="Deadline of one rollout, seconds. Default: collect.rollout_timeout (600)."),
]
MaxFailOpt = Annotated[
    int | None, typer.Option(help="Abort after this many failed rollouts. Default: no limit.")
]
RateOpt = Annotated[
    float | None,
    typer.Option(
        help="Abort when this fraction of finished rollouts failed (1 = only when all failed). "
        "Default: collect.max_failure_rate (0.5)."
    ),
]
SamplesOpt = Annotated[
    int | None,
    typer.Option(help="Finished rollouts needed before --max-failure-rate applies. Default: 50."),
]
AttemptsOpt = Annotated[
    int | None,
    typer.Option(help="Total attempts per rollout across --resume. Default: 3."),
]
ThresholdOpt = Annotated[
    float | None, typer.Option(help="Reward at which a rollout passes (pass@k). Default: 1.0.")
]
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar.")]
LogOpt = Annotated[str, typer.Option(help="Log level (DEBUG shows every retry decision).")]
RayOpt = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Run on a Ray cluster: servers' replicas spread over its nodes, collection over "
        "worker actors, one output directory. Needs `pip install rollgym[ray]`.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join (implies --ray). Default: $RAY_ADDRESS, else a new local Ray."
    ),
]
InProcessOpt = Annotated[
    bool | None,
    typer.Option(
        "--agent-in-process/--agent-as-server",
        help="Run the agents inside the collector's process: no /run hop and no agent "
        "process, the same records (the agent's code shares the collector's event loop; see "
        "the README's benchmarks for what it buys). Not with --ray. Default: "
        "collect.agent_in_process (off).",
        show_default=False,
    ),
]
RayWorkersOpt = Annotated[
    int | None, typer.Option(min=1, help="Collect worker actors with --ray. Default: one per node.")
]


EXIT_CODES_HELP = (
    "Exit codes: 0 all rollouts succeeded; 1 the run completed but some rollouts failed (see "
    "failures.jsonl); 2 the run could not start (bad config or input) or was aborted (failure "
    "budget, configuration error, interrupt; an aborted run is finished with --resume)."
)
RUN_HELP = (
    "Start the servers of CONFIG, collect rollouts of the input into --output, stop them.\n\n"
    "Writes tasks.jsonl, rollouts.jsonl, failures.jsonl, metrics.json and run.json.\n\n"
    + EXIT_CODES_HELP
)
COLLECT_HELP = (
    "Collect against servers that are already running (one set of servers, many runs), with "
    "the same outputs as `run`.\n\n" + EXIT_CODES_HELP
)


def _collect_config(
    cfg: Config, recorded: RecordedInputs | None = None, **overrides: Any
) -> CollectConfig:
    """The collect section of ``cfg`` with the options given on the command line; ``--agent``
    runs every row, whatever its ``agent_ref`` names. On ``--resume`` (``recorded``), the run's
    own repeats and limit stand in for options not given: they are what identifies the run."""
    from pydantic import ValidationError

    from rollgym.config import CollectConfig, format_validation_error

    given = {k: v for k, v in overrides.items() if v is not None}
    data = cfg.collect.model_dump()
    if recorded is not None:
        data.update(repeats=recorded.repeats or data["repeats"], limit=recorded.limit)
    data.update(given)
    if given.get("agent") is not None:
        data["ignore_agent_ref"] = True
    try:
        return CollectConfig.model_validate(data)
    except ValidationError as exc:
        flags = {key: f"--{key.replace('_', '-')}" for key in given}
        source = cfg.source or "config"
        raise ConfigError(
            format_validation_error(source, exc, prefix="collect", names=flags, model=CollectConfig)
        ) from None


def _recorded(output: Path, resume: bool) -> RecordedInputs | None:
    """On ``--resume``, what the run in ``output`` was run with (None: nothing readable there;
    the run's preparation says why)."""
    from rollgym.collect.rundir import recorded_inputs

    return recorded_inputs(output) if resume else None


def _input_path(cfg: Config, given: Path | None, recorded: RecordedInputs | None = None) -> Path:
    if given is not None:
        return given
    if recorded is not None and recorded.input is not None:
        return recorded.input
    if cfg.collect.input is None:
        raise ConfigError(f"{cfg.source}: no --input given and no collect.input in the config")
    return cfg.base_dir() / cfg.collect.input


def print_outcome(outcome: RunOutcome, command: str = "run") -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    m = outcome.metrics
    counts, reward = m["counts"], m["reward"]
    table = Table(title=f"rollgym {command}: {outcome.status}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "rollouts",
        f"{counts['succeeded']} ok, {counts['failed']} failed, {counts['pending']} pending "
        f"of {counts['total']}",
    )
    if reward["mean"] is not None:
        table.add_row("reward", f"mean {reward['mean']:.4f}  std {reward['std']:.4f}")
    shown = list(m["pass_at_k"].items())
    if len(shown) > 6:  # all k are in metrics.json; print powers of two and the largest
        keep = {f"pass@{2**i}" for i in range(20)} | {shown[-1][0]}
        shown = [(k, v) for k, v in shown if k in keep]
    for key, value in shown:
        table.add_row(key, f"{value:.4f}")
    env = {**m.get("env_metrics", {}), **((m.get("env_aggregate") or {}).get("key_metrics") or {})}
    env = {k: v for k, v in env.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if env:
        table.add_row("env metrics", ", ".join(f"{k} {v:.4g}" for k, v in sorted(env.items())))
    if m["failures"]["by_type"]:
        table.add_row(
            "failures",
            ", ".join(f"{k}: {v}" for k, v in m["failures"]["by_type"].items())
            + "  (by server: "
            + ", ".join(f"{k}: {v}" for k, v in m["failures"]["by_server"].items())
            + ")",
        )
    timing = m["timing"]
    table.add_row(
        "time", f"{timing['wall_seconds']:.1f}s, {timing['rollouts_per_second']} rollouts/s"
    )
    if outcome.abort_reason:
        table.add_row("[red]aborted", outcome.abort_reason)
    out = outcome.out_dir
    table.add_row("output", f"{out}/ rollouts.jsonl failures.jsonl metrics.json run.json")
    console.print(table)
    if outcome.abort_reason:
        console.print(
            f"Summary of failures is in {out / 'run.json'} (abort); finish later with --resume."
        )


async def _run(
    cfg: Config,
    collect: CollectConfig,
    input_path: Path,
    output: Path,
    resume: bool,
    agent: str | None,
    progress: bool,
    log_level: str,
    urls: dict[str, list[str]] | None,
) -> RunOutcome:
    """``run`` launches the config's servers; ``collect`` (``urls`` given) finds them running."""
    from rollgym.collect import RunningServers, run_collection
    from rollgym.collect.inprocess import in_process_agents
    from rollgym.launch import Supervisor

    agent_name = cfg.agent_name(agent)  # pre-flight: fails before anything is written
    launcher: Launcher
    in_process = in_process_agents(cfg) if collect.agent_in_process else []
    if urls is None:
        launcher = Supervisor(cfg, log_dir=output / "logs", log_level=log_level, skip=in_process)
    elif agent_name not in urls and agent_name not in in_process:
        raise ConfigError(
            f"no URL for agent {agent_name!r}: pass --servers {agent_name}=URL "
            f"or set servers.{agent_name}.url in {cfg.source}"
        )
    else:
        launcher = RunningServers(urls)
    return await run_collection(
        cfg, collect, input_path, output, launcher, resume=resume, agent=agent, progress=progress
    )


def _finish(outcome: RunOutcome, command: str = "run") -> None:
    print_outcome(outcome, command)
    raise typer.Exit(outcome.exit_code)


def _parse_servers(values: list[str]) -> dict[str, list[str]]:
    """``--servers`` values (NAME=URL, or a JSON file of NAME: URL or [URL, ...]) as name ->
    URLs; every URL checked here, so a typo fails before anything is written."""
    urls: dict[str, list[str]] = {}
    for value in values:
        if "=" in value:
            name, url = (part.strip() for part in value.split("=", 1))
            if not name:
                raise ConfigError(f"--servers {value}: expected NAME=URL (e.g. agent=http://...)")
            urls.setdefault(name, []).append(http_url(url, f"--servers {value}"))
            continue
        path = Path(value)
        if "://" in value and not path.exists():
            raise ConfigError(
                f"--servers {value}: name the server it is, as NAME=URL (e.g. agent={value})"
            )
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(
                f"--servers {value}: not NAME=URL nor a readable JSON file: {exc}"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"--servers {value}: expected a JSON object of NAME: URL(s)")
        for name, got in data.items():
            listed = [got] if isinstance(got, str) else got
            if not isinstance(listed, list) or not listed:
                raise ConfigError(
                    f"--servers {value}: {name}: expected a URL or a list of URLs, not {got!r}"
                )
            for url in listed:
                where = f"--servers {value}: {name}"
                if not isinstance(url, str):
                    raise ConfigError(f"{where}: {url!r} is not a URL")
                urls.setdefault(name, []).append(http_url(url, where))
    return urls


def _config_urls(cfg: Config) -> dict[str, list[str]]:
    """The ``url:`` of each server in the config, each checked naming its file and key."""
    return {
        name: [http_url(s.url, f"{cfg.source}: servers.{name}.url")]
        for name, s in cfg.servers.items()
        if s.url
    }


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=RUN_HELP)
    def run(
        config: ConfigArg,
        output: OutputOpt,
        input: InputOpt = None,
        agent: AgentOpt = None,
        repeats: RepeatsOpt = None,
        concurrency: ConcOpt = None,
        limit: LimitOpt = None,
        resume: ResumeOpt = False,
        rollout_timeout: TimeoutOpt = None,
        max_failures: MaxFailOpt = None,
        max_failure_rate: RateOpt = None,
        min_failure_samples: SamplesOpt = None,
        max_rollout_attempts: AttemptsOpt = None,
        pass_threshold: ThresholdOpt = None,
        agent_in_process: InProcessOpt = None,
        progress: ProgressOpt = True,
        log_level: LogOpt = "WARNING",
        ray: RayOpt = False,
        ray_address: RayAddressOpt = None,
        ray_workers: RayWorkersOpt = None,
    ) -> None:
        from rollgym.cli.main import setup_logging
        from rollgym.config import load_config
        from rollgym.server.base import check_servers

        setup_logging(log_level)
        cfg = load_config(config)
        _config_urls(cfg)  # a server given by url: checked before anything starts
        check_servers(cfg)  # every impl imports, every option is valid: before any write
        recorded = _recorded(output, resume)
        input_path = _input_path(cfg, input, recorded)
        collect = _collect_config(
            cfg, recorded, agent=agent, repeats=repeats, concurrency=concurrency, limit=limit,
            rollout_timeout=rollout_timeout, max_failures=max_failures,
            max_failure_rate=max_failure_rate, min_failure_samples=min_failure_samples,
            max_rollout_attempts=max_rollout_attempts, pass_threshold=pass_threshold,
            agent_in_process=agent_in_process,
        )  # fmt: skip
        if ray or ray_address is not None:
            try:
                from rollgym.ray import run_on_ray
            except ImportError as exc:
                raise ConfigError(
                    f"--ray needs Ray installed (pip install 'rollgym[ray]'): {exc}"
                ) from None
            on_ray = run_on_ray(
                cfg, collect, input_path, output, resume=resume, agent=agent,
                address=ray_address, workers=ray_workers, progress=progress, log_level=log_level,
            )  # fmt: skip
            _finish(_guarded(on_ray, output, collects_here=False))
            return
        outcome = _guarded(
            _run(cfg, collect, input_path, output, resume, agent, progress, log_level, None),
            output,
        )
        _finish(outcome)

    @app.command(cls=PlainHelpCommand, help=COLLECT_HELP)
    def collect(
        config: ConfigArg,
        output: OutputOpt,
        servers: Annotated[
            list[str] | None,
            typer.Option(
                "--servers",
                "-s",
                help="Running servers: NAME=URL (repeatable), or the JSON file written by "
                "`rollgym serve --write-urls`. Default: the `url:` of each server in the config.",
            ),
        ] = None,
        input: InputOpt = None,
        agent: AgentOpt = None,
        repeats: RepeatsOpt = None,
        concurrency: ConcOpt = None,
        limit: LimitOpt = None,
        resume: ResumeOpt = False,
        rollout_timeout: TimeoutOpt = None,
        max_failures: MaxFailOpt = None,
        max_failure_rate: RateOpt = None,
        min_failure_samples: SamplesOpt = None,
        max_rollout_attempts: AttemptsOpt = None,
        pass_threshold: ThresholdOpt = None,
        agent_in_process: InProcessOpt = None,
        progress: ProgressOpt = True,
        log_level: LogOpt = "WARNING",
    ) -> None:
        from rollgym.cli.main import setup_logging
        from rollgym.config import load_config

        setup_logging(log_level)
        cfg = load_config(config)
        urls = _config_urls(cfg)
        urls.update(_parse_servers(servers or []))
        recorded = _recorded(output, resume)
        input_path = _input_path(cfg, input, recorded)
        collect_cfg = _collect_config(
            cfg, recorded, agent=agent, repeats=repeats, concurrency=concurrency, limit=limit,
            rollout_timeout=rollout_timeout, max_failures=max_failures,
            max_failure_rate=max_failure_rate, min_failure_samples=min_failure_samples,
            max_rollout_attempts=max_rollout_attempts, pass_threshold=pass_threshold,
            agent_in_process=agent_in_process,
        )  # fmt: skip
        outcome = _guarded(
            _run(cfg, collect_cfg, input_path, output, resume, agent, progress, log_level, urls),
            output,
        )
        _finish(outcome, "collect")


def _guarded(coro: Any, output: Path, *, collects_here: bool = True) -> RunOutcome:
    """Run ``coro``; ``collects_here``: this process runs the collector (tuned for it, on
    uvloop), not only a Ray driver (stock asyncio, as Ray's own asyncio support expects)."""
    import asyncio

    from rollgym import runtime

    try:
        if collects_here:
            runtime.tune_gc()
            result: RunOutcome = runtime.run(coro)
        else:
            result = asyncio.run(coro)
    except KeyboardInterrupt:
        # Ctrl-C where the run does not handle signals itself; run.json says where it stopped.
        raise RunAborted(
            f"interrupted; {output / 'run.json'} records how far the run got, and --resume "
            "finishes it"
        ) from None
    return result
