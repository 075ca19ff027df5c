"""The progress bar of a run: done/total, rate, elapsed/ETA and the failure count."""

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
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("run", total=total, completed=done, failed=0, rate="")
        self._progress.start()

    def advance(self, failed: bool) -> None:
        if failed:
            self.failed += 1
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, advance=1, failed=self.failed)
        speed = self._progress.tasks[0].speed
        if speed:
            self._progress.update(self._task, rate=f"{speed:.1f}/s")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
