"""``rollgym replay``: run a recorded run's environment side again with the model's outputs
served from the record, or fork its rollouts at a turn onto a live model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollgym.cli.kit import ConcOpt, LogOpt, OutputOpt, PlainHelpCommand, ProgressOpt
from rollgym.errors import ConfigError

if TYPE_CHECKING:
    from rollgym.replay import ReplayReport

HELP = (
    "Replay the recorded rollouts of RUN_DIR: the config's agents and environments run again "
    "(session seeding, every tool call, the verifier) while a replay model server answers each "
    "model call with the output recorded for that rollout and turn; every tool output, the "
    "reward and the verifier's fields are checked against the record. Writes --output as a "
    "normal run (its ledger names each rollout's parent) plus replay.json: per rollout, "
    "identical or the first divergence (turn, field, both values), and whether the environment "
    "differs from the recorded one. --fork-at K replays the first K turns and continues with "
    "the live model of --config. Exit 0: all identical; 1: some diverge; 2: usage errors."
)


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=HELP)
    def replay(
        run_dir: Annotated[Path, typer.Argument(help="Output directory of the run to replay.")],
        output: OutputOpt,
        config: Annotated[
            Path | None,
            typer.Option(help="Config to replay with (default: the one in RUN_DIR/run.json)."),
        ] = None,
        rollouts: Annotated[
            str | None, typer.Option(help="Rollouts to replay: TASK:ROLLOUT ids, comma-separated.")
        ] = None,
        sample: Annotated[
            int | None, typer.Option(help="Replay this many rollouts, drawn with --seed.")
        ] = None,
        seed: Annotated[int, typer.Option(help="Seed of --sample.")] = 0,
        fork_at: Annotated[
            int | None,
            typer.Option(help="Replay the first K turns, then continue with --config's model."),
        ] = None,
        concurrency: ConcOpt = None,
        progress: ProgressOpt = True,
        log_level: LogOpt = "WARNING",
    ) -> None:
        from rollgym import runtime
        from rollgym.cli.kit import setup_logging
        from rollgym.collect.layout import RunDir
        from rollgym.config import load_config
        from rollgym.dialects import ROW_DIALECTS, SERVER_DIALECTS
        from rollgym.replay import REPORT_FILE
        from rollgym.replay import replay as run_replay

        setup_logging(log_level)
        if not run_dir.is_dir():
            raise ConfigError(f"{run_dir}: no such run directory")
        if not RunDir(run_dir).tasks.exists():
            raise ConfigError(f"{run_dir}: not a run directory (no tasks.jsonl)")
        if fork_at is not None and config is None:
            raise ConfigError("--fork-at needs --config: the config naming the live model")
        cfg = load_config(config) if config is not None else None
        job = run_replay(
            run_dir, output, config=cfg, rollouts=rollouts, sample=sample, seed=seed,
            fork_at=fork_at, concurrency=concurrency, progress=progress, log_level=log_level,
            agent_dialects=SERVER_DIALECTS, dialects=ROW_DIALECTS,
        )  # fmt: skip
        try:
            _, report = runtime.run(job)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        print_report(report, output / REPORT_FILE)
        raise typer.Exit(0 if not report.diverged else 1)


def print_report(report: ReplayReport, path: Path) -> None:
    """The terminal table: one row per rollout that diverged (the first ``SHOWN``: all the
    report holds), a summary."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = report.summary()
    fork = summary.get("fork_at")
    title = f"rollgym replay: {summary['identical']} of {summary['replayed']} identical"
    if fork is not None:
        title = f"rollgym replay --fork-at {fork}: {summary['identical']} of {summary['replayed']} prefixes identical"
    table = Table(title=title)
    for column in ("rollout", "turn", "field", "recorded", "replayed"):
        table.add_column(column, overflow="fold")
    for shown in report.shown:
        entry = shown.to_dict()
        d = entry.get("divergence") or {}
        field = d.get("field", "")
        if d.get("key") is not None:
            field = f"{field} [{d['key']}]"
        table.add_row(
            entry["rollout"], str(d.get("turn", "")), field,
            _short(d.get("recorded")), _short(d.get("replayed")),
        )  # fmt: skip
    if report.shown:
        console.print(table)
        if report.diverged > len(report.shown):
            more = report.diverged - len(report.shown)
            console.print(f"  ... {more} more in the report", highlight=False)
    else:
        console.print(title, highlight=False)
    env = summary.get("environment") or {}
    if env.get("differs"):
        for line in (env.get("fingerprint_changes") or {}).items():
            console.print(
                f"environment differs from the recorded one: {line[0]}: {', '.join(line[1])}",
                highlight=False,
            )
        for line in env.get("code_changes") or []:
            console.print(
                f"environment code differs from the recorded one: {line}", highlight=False
            )
    elif env.get("fingerprints") == "unknown":
        console.print(
            "environment: the recorded run carries no fingerprint to compare", highlight=False
        )
    console.print(f"report: {path}", highlight=False)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
