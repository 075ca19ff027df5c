"""The pieces every command shares: the help layout, the options of ``run``/``collect``/
``reverify``, how given options override a config's collect section, and how a run's outcome
is printed and turned into the exit code. Imported by the commands; imports none of them."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer
from typer.core import TyperCommand

from rollgym.errors import ConfigError, RunAborted

if TYPE_CHECKING:
    # Imported where used: `rollgym --help` must not pay for the collector, the launcher and
    # pydantic's schemas (a third of a second).
    from rollgym.collect import RunOutcome
    from rollgym.collect.rundir import RecordedInputs
    from rollgym.config import CollectConfig, Config


class PlainHelpCommand(TyperCommand):
    """A command whose ``--help`` is click's plain layout. Rich's option table cuts long option
    names to fit the terminal (``--max-rollout-attem…`` at 80 columns), so a reader could not
    learn the option from the help; click's layout wraps the descriptions instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """Arguments as the help text names them (``CONFIG``, ``[DIR]``), not typer's
        ``{config}``, a placeholder a reader would not know to replace."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            name = (param.metavar or param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def setup_logging(level: str) -> None:
    if level.upper() not in LOG_LEVELS:
        raise ConfigError(f"--log-level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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
MaskExploitsOpt = Annotated[
    bool | None,
    typer.Option(
        "--mask-exploits/--keep-exploits",
        help="Mask the rollouts whose integrity verdict is exploit (the reward kept, the sample "
        "left out of statistics and training, as mask_sample; never a reward of 0). Default: "
        "collect.mask_exploits (off).",
        show_default=False,
    ),
]
ProgressOpt = Annotated[
    bool,
    typer.Option(
        help="Show a progress bar (on a terminal, with a status line under it: rollouts in "
        "flight, failures by type, open circuits, the slowest hops)."
    ),
]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=65535,
        help="Serve the collector's Prometheus metrics at http://HOST:PORT/metrics (0: a free "
        "port, its URL printed and recorded in run.json as metrics_url), and list every "
        "process of the run that serves metrics (collector, servers, Ray workers) in "
        "OUTPUT/scrape_targets.json for Prometheus's file_sd while it runs. Default: off "
        "(every server serves its own /metrics anyway).",
    ),
]
MetricsHostOpt = Annotated[
    str,
    typer.Option(
        help="Address --metrics-port listens on (0.0.0.0: every interface). With --ray, "
        "anything but loopback makes each collect worker serve its metrics on its node's "
        "address."
    ),
]
LogOpt = Annotated[str, typer.Option(help="Log level (DEBUG shows every retry decision).")]
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


@dataclass(frozen=True)
class CollectOptions:
    """The options ``run`` and ``collect`` share, as given on the command line (None: not
    given). Declared once: ``collect_options`` adds them to a command."""

    input: InputOpt = None
    agent: AgentOpt = None
    repeats: RepeatsOpt = None
    concurrency: ConcOpt = None
    limit: LimitOpt = None
    resume: ResumeOpt = False
    rollout_timeout: TimeoutOpt = None
    max_failures: MaxFailOpt = None
    max_failure_rate: RateOpt = None
    min_failure_samples: SamplesOpt = None
    max_rollout_attempts: AttemptsOpt = None
    pass_threshold: ThresholdOpt = None
    agent_in_process: InProcessOpt = None
    mask_exploits: MaskExploitsOpt = None
    progress: ProgressOpt = True
    log_level: LogOpt = "WARNING"
    metrics_port: MetricsPortOpt = None
    metrics_host: MetricsHostOpt = "127.0.0.1"

    def overrides(self) -> dict[str, Any]:
        """The options that stand in for keys of the config's collect section."""
        skip = {"input", "resume", "progress", "log_level", "metrics_port", "metrics_host"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def collect_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with the ``CollectOptions`` in place of its ``options`` parameter: typer
    sees each option (in the order declared, where ``options`` stands), the command gets them
    as one ``CollectOptions``."""
    hints = get_type_hints(command, include_extras=True)
    shared = get_type_hints(CollectOptions, include_extras=True)
    params: list[inspect.Parameter] = []
    for param in inspect.signature(command).parameters.values():
        if param.name == "options":
            params.extend(
                inspect.Parameter(
                    f.name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=f.default,
                    annotation=shared[f.name],
                )
                for f in fields(CollectOptions)
            )
        else:
            params.append(
                param.replace(
                    kind=inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[param.name]
                )
            )
    names = [f.name for f in fields(CollectOptions)]

    @functools.wraps(command)
    def with_options(**given: Any) -> None:
        options = CollectOptions(**{name: given.pop(name) for name in names})
        command(options=options, **given)

    del with_options.__wrapped__  # typer reads the signature below, not the command's
    with_options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in params}
    return with_options


EXIT_CODES_HELP = (
    "Exit codes: 0 all rollouts succeeded; 1 the run completed but some rollouts failed (see "
    "failures.jsonl); 2 the run could not start (bad config or input) or was aborted (failure "
    "budget, configuration error, interrupt; an aborted run is finished with --resume); 3 the "
    "run stopped cleanly at its collect.budget (finish it with --resume and a larger budget)."
)


def collect_config(
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


def recorded_inputs(output: Path, resume: bool) -> RecordedInputs | None:
    """On ``--resume``, what the run in ``output`` was run with (None: nothing readable there;
    the run's preparation says why)."""
    from rollgym.collect.rundir import recorded_inputs as read

    return read(output) if resume else None


def input_path(cfg: Config, given: Path | None, recorded: RecordedInputs | None = None) -> Path:
    if given is not None:
        return given
    if recorded is not None and recorded.input is not None:
        return recorded.input
    if cfg.collect.input is None:
        raise ConfigError(f"{cfg.source}: no --input given and no collect.input in the config")
    return cfg.base_dir() / cfg.collect.input


def collect_inputs(
    cfg: Config, output: Path, options: CollectOptions
) -> tuple[CollectConfig, Path]:
    """The collect section and the input file of a ``run`` or ``collect`` into ``output``."""
    recorded = recorded_inputs(output, options.resume)
    path = input_path(cfg, options.input, recorded)
    return collect_config(cfg, recorded, **options.overrides()), path


def print_outcome(outcome: RunOutcome, command: str = "run") -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rollgym.collect.metrics import CauseCounts

    console = Console()
    m = outcome.metrics
    counts, reward = m["counts"], m["reward"]
    table = Table(title=f"rollgym {command}: {outcome.status}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    # Masked rollouts (mask_sample) are recorded successes whose reward is no measurement.
    masked = (m.get("coverage") or {}).get("masked_rollouts", 0)
    table.add_row(
        "rollouts",
        f"{counts['succeeded'] - masked} ok{f', {masked} masked' if masked else ''}, "
        f"{counts['failed']} failed, {counts['pending']} pending of {counts['total']}",
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
        # By root cause, with the deadline, budget or breaker that ended them beside.
        table.add_row(
            "failures",
            CauseCounts.of(m["failures"]).describe()
            + "  (by server: "
            + ", ".join(f"{k}: {v}" for k, v in m["failures"]["by_server"].items())
            + ")",
        )
    timing = m["timing"]
    table.add_row(
        "time", f"{timing['wall_seconds']:.1f}s, {timing['rollouts_per_second']} rollouts/s"
    )
    if (cost := m.get("cost")) is not None:
        from rollgym.collect.cost_ledger import describe_cost

        table.add_row("cost", describe_cost(cost))
    at_budget = outcome.status == "stopped_at_budget"
    if outcome.abort_reason:
        label = "[yellow]budget" if at_budget else "[red]aborted"
        table.add_row(label, escape(outcome.abort_reason))  # text: "[model]" stays
    out = outcome.out_dir
    table.add_row("output", f"{out}/ rollouts.jsonl failures.jsonl metrics.json run.json")
    console.print(table)
    if at_budget:
        counts = m["counts"]
        abandoned = (cost or {}).get("abandoned_in_flight") or 0
        cut = (
            f" ({abandoned} of them abandoned in flight: started and cancelled, what they spent"
            " is in no record)" if abandoned else ""
        )  # fmt: skip
        console.print(
            f"Stopped at the run's budget: {counts['succeeded'] + counts['failed']} of "
            f"{counts['total']} rollouts recorded, {counts['pending']} pending{cut}; nothing "
            f"recorded is lost. Raise collect.budget and finish it with `rollgym {command}` "
            "and --resume.",
            markup=False, highlight=False,
        )  # fmt: skip
    elif outcome.abort_reason:
        console.print(abort_note(outcome, command), markup=False, highlight=False)


def abort_note(outcome: RunOutcome, command: str = "run") -> str:
    """What is true of an aborted run, and how to finish it: its failures are pointed to only
    when it has any (a run interrupted by Ctrl-C usually has none)."""
    from rollgym.collect.layout import RunDir

    counts, run_dir = outcome.metrics["counts"], RunDir(outcome.out_dir)
    recorded = counts["succeeded"] + counts["failed"]
    note = (
        f"Stopped ({outcome.abort_reason}): {recorded} of {counts['total']} rollouts recorded, "
        f"{counts['pending']} pending."
    )
    if counts["failed"]:
        note += (
            f" {counts['failed']} failed: each is in {run_dir.failures}, and the summary that "
            f"stopped the run in {run_dir.run_json} (abort)."
        )
    return note + f" Finish it with the same `rollgym {command}` command and --resume."


def finish(outcome: RunOutcome, command: str = "run") -> None:
    print_outcome(outcome, command)
    raise typer.Exit(outcome.exit_code)


def guarded(coro: Any, output: Path, *, collects_here: bool = True) -> RunOutcome:
    """Run ``coro``; ``collects_here``: this process runs the collector (tuned for it, on
    uvloop), not only a Ray driver (stock asyncio, as Ray's own asyncio support expects)."""
    import asyncio

    from rollgym import runtime
    from rollgym.collect.layout import RunDir

    try:
        if collects_here:
            runtime.tune_gc()
            result: RunOutcome = runtime.run(coro)
        else:
            result = asyncio.run(coro)
    except KeyboardInterrupt:
        # Ctrl-C where the run does not handle signals itself; run.json says where it stopped.
        raise RunAborted(
            f"interrupted; {RunDir(output).run_json} records how far the run got, and --resume "
            "finishes it"
        ) from None
    return result
