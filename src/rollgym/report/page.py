"""The report page: one HTML file with Bokeh's JavaScript inlined (no CDN, works offline), a
summary table per run, the plots, the hardest tasks and, with ``--compare``, per-task deltas."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime

from bokeh.embed import components
from bokeh.models import Model
from bokeh.resources import Resources

import rollgym.report.plots as plots  # the module, not the package: it imports this one
from rollgym.health import report_section
from rollgym.report.data import FAILURE_KEYS, HOPS, RunData
from rollgym.report.prompts import prompt_excerpts
from rollgym.report.summary import (
    ENV_HEADER,
    deltas,
    environments,
    hardest,
    headline,
    provenance,
)
from rollgym.version import __version__

# Bokeh's core bundle only, inlined: the plots need none of its widgets, tables, WebGL or MathJax
# bundles (INLINE would add them all: 4 MB instead of 1.3).
_JS = Resources(mode="inline", components=["bokeh"])

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.4em 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f4f4f4; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #eee; padding: 4px; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; }
"""


def _plots(runs: Sequence[RunData]) -> dict[str, Model]:
    figs: dict[str, Model] = {
        "reward": plots.reward_hist(runs),
        "pass_at_k": plots.pass_curve(runs),
        "task_pass_rates": plots.task_pass_rates(runs),
    }
    for i, other in enumerate(runs[1:], start=1):
        figs[f"task_delta_{i}"] = plots.task_deltas(runs[0], other, i)
    for key in FAILURE_KEYS:
        figs[f"failures_{key}"] = plots.failure_bars(runs, key)
    figs["over_time"] = plots.over_time(runs)
    for hop in (*HOPS, "rollout"):
        figs[f"latency_{hop}"] = plots.hop_latency(runs, hop)
    figs["retries"] = plots.retries(runs)
    return figs


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(runs: Sequence[RunData]) -> str:
    """The whole report for ``runs`` (the first is the base of a comparison) as HTML."""
    figs = _plots(runs)
    script, divs = components(figs)
    heads = [headline(r) for r in runs]
    keys = list(dict.fromkeys(k for h in heads for k in h))
    swatches = [
        f'<span class="swatch" style="background:{plots.color(i)}"></span>{html.escape(r.name)}'
        for i, r in enumerate(runs)
    ]
    summary = "<table><tr><th></th>" + "".join(f"<th>{s}</th>" for s in swatches) + "</tr>"
    for key in keys:
        cells = "".join(f"<td>{html.escape(h.get(key, '-'))}</td>" for h in heads)
        summary += f"<tr><th>{html.escape(key)}</th>{cells}</tr>"
    summary += "<tr><th>directory</th>" + "".join(
        f"<td>{html.escape(str(r.path))}</td>" for r in runs
    ) + "</tr></table>"  # fmt: skip
    sections = [
        ("Rewards", ["reward", "pass_at_k", "task_pass_rates"]
         + [k for k in divs if k.startswith("task_delta_")]),
        ("Failures", [*(f"failures_{k}" for k in FAILURE_KEYS), "over_time"]),
        ("Latency per hop", [f"latency_{h}" for h in (*HOPS, "rollout")]),
        ("Retries and circuits", ["retries"]),
    ]  # fmt: skip
    body = [f"<h2>Runs</h2>{summary}"]
    if len(runs) > 1:
        said = provenance(list(runs))
        items = "".join(f"<li>{html.escape(line)}</li>" for line in said)
        body.append(f"<h2>Environments that scored them</h2><ul>{items}</ul>")
    for title, keys_ in sections:
        cells = "".join(f'<div class="plot">{divs[k]}</div>' for k in keys_)
        body.append(f'<h2>{title}</h2><div class="grid">{cells}</div>')
    for run in runs:
        envs = environments(run)
        if envs:
            body.append(
                f"<h2>Per environment: {html.escape(run.name)}</h2>" + _table(ENV_HEADER, envs)
            )
    for run in runs:
        worst = hardest(run)
        # What each task asked (escaped by _table, like every cell): an index alone says little.
        asked = prompt_excerpts(run.path, [r.task_index for r in worst])
        rows: list[tuple[object, ...]] = [
            (r.task_index, asked.get(r.task_index, ""), r.scored, r.passed, r.failed, r.masked,
             _rate(r.pass_rate), _rate(r.reward_mean))
            for r in worst
        ]  # fmt: skip
        header = ("task", "prompt", "scored", "passed", "failed", "masked", "pass rate",
                  "reward mean")  # fmt: skip
        body.append(f"<h2>Hardest tasks: {html.escape(run.name)}</h2>" + _table(header, rows))
    # The checks of `rollgym health` with their default thresholds (one more streaming pass).
    body += [report_section(run.path, run.name) for run in runs]
    for other in runs[1:]:
        moved: list[tuple[object, ...]] = [
            (d.task_index, _rate(d.before), _rate(d.after), f"{d.change:+.2f}")
            for d in deltas(runs[0], other)
        ]
        body.append(
            f"<h2>Per-task pass rate, {html.escape(runs[0].name)} → {html.escape(other.name)}"
            "</h2>"
            + (_table(("task", runs[0].name, other.name, "change"), moved) if moved else
               "<p>No task's pass rate changed.</p>")
        )  # fmt: skip
    made = datetime.now(UTC).isoformat(timespec="seconds")
    title = "rollgym report: " + ", ".join(r.name for r in runs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style>
{_JS.render_js()}
</head><body>
<h1>{html.escape(title)}</h1>
<p>Made {made} by rollgym {__version__}. Works offline: everything is in this file.</p>
{"".join(body)}
{script}
</body></html>
"""
