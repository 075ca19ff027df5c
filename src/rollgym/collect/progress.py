"""The progress bar of a run: done/total, rate, elapsed/ETA, the failed and the masked counts
(a masked rollout is recorded, but its reward is no measurement)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RunProgress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.failed = 0
        self.masked = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, total: int, done: int = 0) -> None:
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("[yellow]{task.fields[masked]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            refresh_per_second=4,
        )
        self._task = self._progress.add_task(
            "run", total=total, completed=done, failed=self.failed, masked=_masked(self.masked),
            rate="",
        )  # fmt: skip
        self._progress.start()

    def advance(self, failed: bool, masked: bool = False) -> None:
        self.failed += failed
        self.masked += masked
        if self._progress is None or self._task is None:
            return
        self._progress.update(
            self._task, advance=1, failed=self.failed, masked=_masked(self.masked)
        )
        speed = self._progress.tasks[0].speed
        if speed:
            self._progress.update(self._task, rate=f"{speed:.1f}/s")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _masked(count: int) -> str:
    # Shown only once something is masked: most runs mask nothing.
    return f"{count} masked" if count else ""
