"""``rollgym reverify``: score a run's recorded rollouts again with the config's verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollgym.cli.kit import (
    AgentOpt,
    ConcOpt,
    LogOpt,
    MaxFailOpt,
    OutputOpt,
    PlainHelpCommand,
    ProgressOpt,
    RateOpt,
    ResumeOpt,
    ThresholdOpt,
    TimeoutOpt,
    collect_config,
    print_outcome,
)
from rollgym.errors import ConfigError

HELP = (
    "Run the verifier of --config again on every recorded rollout of OUT (/seed_session, the "
    "rollout's recorded tool calls again, then /verify with its task row and recorded "
    "response) and write --output as a "
    "normal run (ledger, metrics.json, run.json), plus reverify_diff.json: the rollouts whose "
    "reward changed, by task, and reward metrics before and after. Only the config's resources "
    "server is started. Rollouts that failed in OUT are copied as they were; rollouts OUT has "
    "not recorded yet stay pending (finish with --resume). Exit codes as for `run`."
)

SHOWN_TASKS = 10


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=HELP)
    def reverify(
        out: Annotated[Path, typer.Argument(help="Output directory of the run to re-verify.")],
        config: Annotated[Path, typer.Option(help="Config whose resources server verifies.")],
        output: OutputOpt,
        agent: AgentOpt = None,
        concurrency: ConcOpt = None,
        resume: ResumeOpt = False,
        rollout_timeout: TimeoutOpt = None,
        max_failures: MaxFailOpt = None,
        max_failure_rate: RateOpt = None,
        pass_threshold: ThresholdOpt = None,
        progress: ProgressOpt = True,
        log_level: LogOpt = "WARNING",
    ) -> None:
        from rich.console import Console

        from rollgym import runtime
        from rollgym.cli.kit import setup_logging
        from rollgym.collect.layout import RunDir
        from rollgym.config import load_config
        from rollgym.reverify import DIFF_FILE
        from rollgym.reverify import reverify as run_reverify

        setup_logging(log_level)
        if not RunDir(out).tasks.exists():
            raise ConfigError(f"{out}: not a run directory (no tasks.jsonl)")
        cfg = load_config(config)  # its servers checked by reverify, before anything is written
        collect = collect_config(
            cfg, agent=agent, concurrency=concurrency, rollout_timeout=rollout_timeout,
            max_failures=max_failures, max_failure_rate=max_failure_rate,
            pass_threshold=pass_threshold,
        )  # fmt: skip
        job = run_reverify(
            cfg, collect, out, output, resume=resume, agent=agent, progress=progress,
            log_level=log_level,
        )  # fmt: skip
        try:
            outcome, diff = runtime.run(job)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        print_outcome(outcome, "reverify")
        console = Console()
        before, after = diff.before, diff.after
        console.print(
            f"reverify: {len(diff.changed)} of {diff.compared} rollouts changed reward; "
            f"mean {_fmt(before.get('reward_mean'))} -> {_fmt(after.get('reward_mean'))}",
            highlight=False,
        )
        for key in sorted(after.get("pass_at_k", {}), key=lambda k: int(k.split("@")[1]))[:4]:
            b, a = before["pass_at_k"].get(key), after["pass_at_k"][key]
            console.print(f"  {key}: {_fmt(b)} -> {_fmt(a)}", highlight=False)
        tasks = diff.by_task()
        for task in sorted(tasks, key=lambda t: -len(tasks[t]))[:SHOWN_TASKS]:
            changes = ", ".join(
                f"{c.rollout_index}: {c.before:g}->{'failed' if c.after is None else f'{c.after:g}'}"
                for c in tasks[task][:8]
            )
            console.print(f"  task {task}: {changes}", highlight=False)
        if len(tasks) > SHOWN_TASKS:
            console.print(f"  ... {len(tasks) - SHOWN_TASKS} more tasks", highlight=False)
        console.print(f"diff: {output / DIFF_FILE}", highlight=False)
        raise typer.Exit(outcome.exit_code)


def _fmt(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
