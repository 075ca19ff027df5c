"""``rollgym audit``: play a panel of answers that need no knowledge of the task against every
environment of a config, and name what pays (``rollgym.audit``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand

if TYPE_CHECKING:
    from rollgym.audit.run import AuditReport

EXIT_FINDINGS = 1
_COLOURS = {
    "clean": "green", "unreliable": "yellow", "exploitable": "bold red", "unaudited": "yellow",
}  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand)
    def audit(
        config: Annotated[
            Path,
            typer.Argument(
                help="The config whose environments to audit, or a directory of Harbor tasks."
            ),
        ],
        input: Annotated[
            Path | None,
            typer.Option("--input", help="Task rows (JSONL); default: the config's collect.input."),
        ] = None,
        output: Annotated[
            Path, typer.Option("--output", help="Directory to write audit.json into.")
        ] = Path("audit"),
        limit: Annotated[
            int | None,
            typer.Option(
                min=1,
                help="Rows to play the panel on, spread over the file (default 8); with a "
                "directory of Harbor tasks, its first LIMIT tasks (default all).",
            ),
        ] = None,
        timeout: Annotated[
            float, typer.Option(min=0.1, help="Seconds one call to an environment may take.")
        ] = 30.0,
        concurrency: Annotated[
            int, typer.Option(min=1, help="Plays in flight on one environment.")
        ] = 8,
    ) -> None:
        """Audit every resources server of CONFIG (the ones rollgym starts and the ones given by
        url:) for rewards a policy can take without solving the task.

        On LIMIT rows it plays, through the environment's own protocol (/seed_session, its
        tools, /verify; or /reset + /step), a panel of probe answers that need no knowledge of
        the task: empty_answer, format_only, prompt_echo, candidate_list, early_exit,
        always_equal, verdict_injection, tool_leak, nondeterministic (one answer several times)
        and crash (hostile output). Each is compared with the floor (what a plainly wrong answer
        earns on the same row) and with the row's reference answer, if it has one: a probe that
        earns more than the floor with an answer that is not right is a finding.

        A server is `exploitable` when some probe pays, `unreliable` when it only crashes
        (5xx, timeout, garbage) or scores one answer differently, `unaudited` when it scored
        no play (it refused every one: not the protocol played), `clean` otherwise. Writes
        OUTPUT/audit.json and prints a table. Exit 0 when every server is clean, 1 on findings,
        2 on a usage error (a bad config, a missing task file).

        CONFIG may be a directory of Harbor tasks: then every task (the first LIMIT) is played
        by the container forging probes of rollgym.harbor.probes (write reward files, edit the
        tests or plant conftest.py, read git history, read /solution or /tests, leave a process
        running into the verify; rewrite the interpreter, PATH's first directory or /bin,
        which must earn nothing; plant Python's startup files, which must be flagged
        integrity_suspect), CONCURRENCY trials at a time, in podman containers."""
        from rollgym import runtime
        from rollgym.audit.run import LIMIT, audit_config
        from rollgym.config import load_config
        from rollgym.dialects import AUDIT_DIALECTS

        if config.is_dir():
            from rollgym.audit.containers import audit_task_directory

            report = runtime.run(
                audit_task_directory(config, limit=limit, concurrency=min(concurrency, 8))
            )
            path = report.write(output)
            _print(report, path)
            if not report.clean:
                raise typer.Exit(EXIT_FINDINGS)
            return
        cfg = load_config(config)
        report = runtime.run(
            audit_config(
                cfg, input=input, limit=limit or LIMIT, timeout=timeout, concurrency=concurrency,
                log_dir=output / "logs", dialects=AUDIT_DIALECTS,
            )
        )  # fmt: skip
        path = report.write(output)
        _print(report, path)
        if not report.clean:
            raise typer.Exit(EXIT_FINDINGS)


def _print(report: AuditReport, path: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    table = Table("server", "verdict", "class", "probe", "paid/tried", "reward vs floor")
    for name, audit in report.servers.items():
        colour = _COLOURS[audit.verdict]
        verdict = f"[{colour}]{audit.verdict}[/] ({audit.seconds:g} s)"
        if not audit.findings:
            table.add_row(escape(name), verdict, "", "", "", "")
        for n, f in enumerate(audit.findings):
            vs = "" if f.mean_reward is None else f"{f.mean_reward:g}"
            vs += "" if f.mean_floor is None else f" vs {f.mean_floor:g}"
            table.add_row(
                escape(name) if n == 0 else "", verdict if n == 0 else "", f.cls,
                escape(f.probe[:60]), f"{f.rows_paid}/{f.rows_tried}", vs,
            )  # fmt: skip
    console.print(table)
    console.print(f"written: {escape(str(path))}")
