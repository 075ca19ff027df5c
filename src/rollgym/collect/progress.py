"""The progress bar of a run: done/total, rate, elapsed/ETA, the failed and the masked counts
(a masked rollout is recorded, but its reward is no measurement), and under it a status line
for long runs (``collect.live``: rollouts in flight, failures by type, open circuits named, the
slowest hops), set from the event loop about once a second (``set_status``). On a console
that is no terminal nothing is redrawn: the last state is printed once, at the end."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _StatusProgress(Progress):
    """rich's ``Progress`` with a status line under the bar. The status is a ``Text`` made on
    the event loop; the refresh thread only reads the reference (no shared state is walked
    from that thread)."""

    status: Text | None = None

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.status is not None:
            yield self.status


class RunProgress:
    def __init__(self, enabled: bool = True, *, console: Console | None = None) -> None:
        self.enabled = enabled
        self.failed = 0
        self.masked = 0
        self._console = console
        self._progress: _StatusProgress | None = None
        self._task: TaskID | None = None

    @property
    def watched(self) -> bool:
        """Whether a person may be watching: the bar is on and redrawn on a terminal (the
        status line is worth computing)."""
        return self._progress is not None and self._progress.console.is_terminal

    def start(self, total: int, done: int = 0) -> None:
        if not self.enabled:
            return
        self._progress = _StatusProgress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("[yellow]{task.fields[masked]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self._console or Console(file=sys.stderr),
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

    def set_status(self, markup: str) -> None:
        """The status line under the bar (rich markup), shown from the next refresh on."""
        if self._progress is not None:
            self._progress.status = Text.from_markup(markup, overflow="ellipsis")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _masked(count: int) -> str:
    # Shown only once something is masked: most runs mask nothing.
    return f"{count} masked" if count else ""
