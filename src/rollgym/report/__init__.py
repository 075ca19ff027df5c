"""``rollgym report``: one self-contained HTML file about one run, or several side by side.

load_run (data.py)      the run directory -> RunData (one streaming pass over the ledger)
plots.py                RunData -> Bokeh figures (binned: the page does not grow with runs)
summary.py              headline numbers, hardest tasks, per-task deltas; the terminal text
prompts.py              the hardest tasks' prompts, as short excerpts from tasks.jsonl
page.py                 figures + tables -> one HTML file, Bokeh's JS inlined (offline)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rollgym.errors import ConfigError
from rollgym.report.data import RunData, load_run

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class Report:
    path: Path
    size: int
    runs: list[RunData]
    summary: str


def write_report(out: Path, compare: list[Path] | None = None) -> Report:
    """Write ``out/report.html`` about the run in ``out`` (and the runs of ``compare``,
    overlaid, with per-task deltas against ``out``)."""
    from rollgym.report.page import render  # Bokeh is imported only to draw
    from rollgym.report.summary import terminal

    paths = [out, *(compare or [])]
    names = _names(paths)
    runs = [load_run(p, n) for p, n in zip(paths, names, strict=True)]
    page = render(runs).encode()
    path = out / REPORT_FILE
    # Created anew (never through a link planted at its name), then renamed over the page: a
    # link at report.html is replaced, not followed.
    tmp = path.with_name(f".{REPORT_FILE}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, 0o644), "wb") as fh:
            fh.write(page)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot be written: {exc.strerror or exc}") from None
    return Report(path, len(page), runs, terminal(runs))


def _names(paths: list[Path]) -> list[str]:
    """Each run's label: its directory's name, with its parent's when two share a name."""
    names = [p.name or str(p) for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    if len(set(names)) < len(names):
        names = [f"{n} #{i}" for i, n in enumerate(names)]
    return names


__all__ = ["REPORT_FILE", "Report", "RunData", "load_run", "write_report"]
