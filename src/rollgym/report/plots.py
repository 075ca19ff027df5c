"""The report's plots, drawn with Bokeh: one function per plot, each taking every run to overlay
(the first is the base of a ``--compare``). Data is binned here, so a plot's size does not grow
with the run: a 100,000-rollout run embeds a few hundred numbers per plot. A distribution of
more than ``SAMPLE`` numbers is drawn from a uniform sample of them (``report.sample``), and
its plot's title says so; counts, means and ranges are exact."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, Range1d
from bokeh.models.annotations import Label, Slope
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from rollgym.report.data import HOPS, RunData
from rollgym.report.sample import SAMPLE, Sample

WIDTH, HEIGHT = 460, 280
TIME_BINS = 120


def color(i: int) -> str:
    return str(Category10_10[i % len(Category10_10)])


def _figure(title: str, **kwargs: Any) -> figure:
    fig = figure(
        title=title, width=WIDTH, height=HEIGHT, tools="pan,box_zoom,wheel_zoom,reset,save,hover",
        toolbar_location="right", **kwargs,
    )  # fmt: skip
    return fig


def _empty(fig: figure, text: str = "no data") -> figure:
    # Drawn, not blank: a plot with nothing to show says so.
    fig.x_range = Range1d(start=0, end=1)
    fig.y_range = Range1d(start=0, end=1)
    fig.add_layout(Label(x=0.5, y=0.5, text=text, text_align="center", text_color="#888"))
    return fig


def _title(title: str, samples: Sequence[Sample]) -> str:
    """``title``, saying the plot is drawn from a sample if it is."""
    if any(s.sampled for s in samples):
        return f"{title} (a sample of {SAMPLE:,} per run)"
    return title


def _values(sample: Sample) -> np.ndarray:
    return np.frombuffer(sample.values, dtype=np.float64)


def _legend(fig: figure) -> figure:
    if fig.legend:
        fig.legend.location = "top_left"
        fig.legend.click_policy = "hide"
        fig.legend.label_text_font_size = "8pt"
    return fig


def reward_hist(runs: Sequence[RunData]) -> figure:
    fig = _figure(
        _title("Reward distribution", [r.rewards for r in runs]),
        x_axis_label="reward",
        y_axis_label="share of rollouts",
    )
    values = [_values(r.rewards) for r in runs]
    if not any(v.size for v in values):
        return _empty(fig, "no scored rollouts")
    lo = min(r.rewards.lo for r in runs if r.rewards.count)
    hi = max(r.rewards.hi for r in runs if r.rewards.count)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, 21)
    for i, (run, v) in enumerate(zip(runs, values, strict=True)):
        if not v.size:
            continue
        counts, _ = np.histogram(v, bins=edges)
        fig.quad(
            top=counts / v.size, bottom=0, left=edges[:-1], right=edges[1:], fill_color=color(i),
            fill_alpha=0.45, line_color=color(i), legend_label=run.name,
        )  # fmt: skip
    return _legend(fig)


def pass_curve(runs: Sequence[RunData]) -> figure:
    fig = _figure("pass@k against k", x_axis_label="k", y_axis_label="pass@k")
    drawn = False
    for i, run in enumerate(runs):
        curve = run.pass_at()
        if not curve:
            continue
        drawn = True
        ks, vs = list(curve), list(curve.values())
        fig.line(ks, vs, color=color(i), line_width=2, legend_label=run.name)
        fig.scatter(ks, vs, color=color(i), size=6, legend_label=run.name)
    return _legend(fig) if drawn else _empty(fig, "no scored rollouts")


def task_pass_rates(runs: Sequence[RunData]) -> figure:
    fig = _figure("Per-task pass rate", x_axis_label="pass rate", y_axis_label="tasks")
    edges = np.linspace(0.0, 1.0, 11)
    drawn = False
    for i, run in enumerate(runs):
        rates = _pass_rates(run)
        if not rates.size:
            continue
        drawn = True
        counts, _ = np.histogram(rates, bins=edges)
        fig.quad(
            top=counts, bottom=0, left=edges[:-1], right=edges[1:], fill_color=color(i),
            fill_alpha=0.45, line_color=color(i), legend_label=run.name,
        )  # fmt: skip
    return _legend(fig) if drawn else _empty(fig, "no scored tasks")


def _pass_rates(run: RunData, upto: int | None = None) -> np.ndarray:
    """Each task's pass rate (NaN: no scored rollout), for the first ``upto`` task slots."""
    table = run.tasks.table
    scored = np.array(table.n, dtype=np.float64)[:upto]
    passed = np.array(table.passed, dtype=np.float64)[:upto]
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(scored > 0, passed / scored, np.nan)
    return rates if upto is not None else rates[~np.isnan(rates)]


def task_deltas(base: RunData, other: RunData, i: int) -> figure:
    """Each task's pass rate in ``other`` against ``base``: off the diagonal, it changed."""
    fig = _figure(
        f"Per-task pass rate: {other.name} vs {base.name}", x_axis_label=base.name,
        y_axis_label=other.name,
    )  # fmt: skip
    upto = min(len(base.tasks.table), len(other.tasks.table))
    xs, ys = _pass_rates(base, upto), _pass_rates(other, upto)
    both = ~np.isnan(xs) & ~np.isnan(ys)
    if not both.any():
        return _empty(fig, "no task scored in both runs")
    # Pass rates take few values (k/n): one circle per pair of rates, sized by its tasks, so the
    # plot stays small however many tasks the runs have.
    pairs, counts = np.unique(
        np.stack([xs[both].round(4), ys[both].round(4)], axis=1), axis=0, return_counts=True
    )
    cells = {(float(x), float(y)): int(n) for (x, y), n in zip(pairs, counts, strict=True)}
    source = ColumnDataSource(
        {
            "x": [x for x, _ in cells],
            "y": [y for _, y in cells],
            "tasks": list(cells.values()),
            "size": [5 + 3 * math.sqrt(n) for n in cells.values()],
        }
    )
    fig.scatter("x", "y", source=source, color=color(i), alpha=0.5, size="size")
    fig.hover.tooltips = [("tasks", "@tasks"), (base.name, "@x"), (other.name, "@y")]
    fig.add_layout(Slope(gradient=1, y_intercept=0, line_color="#888", line_dash="dashed"))
    fig.x_range = Range1d(start=-0.05, end=1.05)
    fig.y_range = Range1d(start=-0.05, end=1.05)
    return fig


def failure_bars(runs: Sequence[RunData], key: str) -> figure:
    """Failed rollouts by ``key`` (``root`` cause, ``type``, ``server`` or ``status``), run
    beside run."""
    counts = [r.failures.by(key) for r in runs]
    cats = sorted({c for cnt in counts for c in cnt}, key=lambda c: -sum(n[c] for n in counts))[:12]
    title = "Failures by root cause" if key == "root" else f"Failures by {key}"
    if not cats:
        return _empty(_figure(title), "no failures")
    names = [r.name for r in runs]
    factors: list[Any] = [(c, n) for c in cats for n in names] if len(runs) > 1 else list(cats)
    tops = [counts[j][c] for c in cats for j in range(len(runs))]
    colors = [color(j) for _ in cats for j in range(len(runs))]
    fig = _figure(
        title, x_range=FactorRange(factors=factors), y_range=Range1d(start=0, end=max(tops) * 1.1),
        y_axis_label="failed rollouts",
    )  # fmt: skip
    source = ColumnDataSource({"x": factors, "top": tops, "color": colors})
    fig.vbar(x="x", top="top", width=0.8, color="color", source=source)
    fig.xaxis.major_label_orientation = 0.6
    return fig


def _seconds(run: RunData) -> tuple[np.ndarray, np.ndarray, float]:
    """(ends of scored rollouts, ends of failures) as kept by their samples, in seconds since
    the run's first record, and the seconds from its first record to its last."""
    kept = [s for s in (run.ends, run.failures.at) if s.count]
    t0 = min((s.lo for s in kept), default=0.0)
    span = max((s.hi - t0 for s in kept), default=0.0)
    return _values(run.ends) - t0, _values(run.failures.at) - t0, span


def over_time(runs: Sequence[RunData]) -> figure:
    """Rollouts finished per second, and failures per second, over the run's time (a resumed
    run shows the gap between its sessions). From a sample, each kept end counts for the
    ends it stands for (``Sample.weight``)."""
    samples = [s for r in runs for s in (r.ends, r.failures.at)]
    fig = _figure(_title("Throughput and failures over time", samples),
                  x_axis_label="seconds since first record", y_axis_label="rollouts / s")  # fmt: skip
    drawn = False
    for i, run in enumerate(runs):
        ok, bad, span = _seconds(run)
        if not ok.size and not bad.size:
            continue
        drawn = True
        width = max(span / TIME_BINS, 1e-3)
        edges = np.arange(0.0, span + 2 * width, width)
        done, _ = np.histogram(ok, bins=edges)
        fig.line(edges[:-1], done * run.ends.weight / width, color=color(i), line_width=2,
                 legend_label=f"{run.name} ok")  # fmt: skip
        if bad.size:
            failed, _ = np.histogram(bad, bins=edges)
            fig.line(edges[:-1], failed * run.failures.at.weight / width, color=color(i),
                     line_dash="dashed", line_width=2, legend_label=f"{run.name} failed")  # fmt: skip
    if not drawn:
        return _empty(fig, "no timestamps (records made before per-hop timing)")
    return _legend(fig)


def hop_latency(runs: Sequence[RunData], hop: str) -> figure:
    """The distribution of one hop's seconds (``rollout``: the whole rollout), log-binned."""
    title = "Rollout duration" if hop == "rollout" else f"Latency: {hop} calls"
    samples = [r.durations if hop == "rollout" else r.hops[hop] for r in runs]
    fig = _figure(_title(title, samples), x_axis_type="log", x_axis_label="seconds",
                  y_axis_label="share of calls")  # fmt: skip
    series = [_values(s) for s in samples]
    positive = [s[s > 0] for s in series]
    if not any(s.size for s in positive):
        return _empty(fig, f"no {hop} timings")
    lo = min(float(s.min()) for s in positive if s.size)
    hi = max(float(s.max()) for s in positive if s.size)
    edges = np.logspace(math.log10(lo), math.log10(hi * 1.0001 if hi > lo else lo * 10), 41)
    for i, (run, s) in enumerate(zip(runs, positive, strict=True)):
        if not s.size:
            continue
        counts, _ = np.histogram(s, bins=edges)
        p50, p99 = np.percentile(s, [50, 99])
        label = f"{run.name} p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
        fig.quad(
            top=counts / s.size, bottom=0, left=edges[:-1], right=edges[1:], fill_color=color(i),
            fill_alpha=0.4, line_color=color(i), legend_label=label,
        )  # fmt: skip
    return _legend(fig)


def retry_events(run: RunData) -> dict[str, int]:
    """Retries and circuit events of one run, by what counted them."""
    events: dict[str, int] = {f"retries: {hop}": run.hop_retries.get(hop, 0) for hop in HOPS}
    events["rollouts tried again"] = run.retried
    http: Counter[str] = Counter()
    sections = [run.metrics.get("http") or {}, *((run.metrics.get("servers") or {}).values())]
    for section in sections:
        if isinstance(section, dict):
            for stats in section.values():
                if isinstance(stats, dict):
                    http.update({k: int(v) for k, v in stats.items() if isinstance(v, int)})
    events["http retries (all callers)"] = http["retries"]
    events["retry budget refusals"] = http["budget_refused"]
    events["circuit rejections"] = http["circuit_rejected"]
    dispatch = run.metrics.get("dispatch") or {}
    events["rollouts held by a circuit"] = int(dispatch.get("circuit_holds") or 0)
    events["failed: circuit_open"] = run.failures.by_type["circuit_open"]
    events["failed: budget_exhausted"] = run.failures.by_type["budget_exhausted"]
    return events


def retries(runs: Sequence[RunData]) -> figure:
    events = [retry_events(r) for r in runs]
    cats = list(events[0])
    names = [r.name for r in runs]
    factors: list[Any] = [(c, n) for c in cats for n in names] if len(runs) > 1 else list(cats)
    rights = [events[j][c] for c in cats for j in range(len(runs))]
    colors = [color(j) for _ in cats for j in range(len(runs))]
    fig = _figure(
        "Retries and circuit events", y_range=FactorRange(factors=factors[::-1]),
        x_range=Range1d(start=0, end=max(max(rights) * 1.15, 1)), x_axis_label="count",
    )  # fmt: skip
    fig.height = 80 + 18 * len(factors)  # a readable bar per (event, run)
    source = ColumnDataSource({"y": factors, "right": rights, "color": colors})
    fig.hbar(y="y", right="right", height=0.8, color="color", source=source)
    if not any(rights):
        fig.add_layout(Label(x=10, y=10, x_units="screen", y_units="screen",
                             text="none: no retries, no circuit events", text_color="#888"))  # fmt: skip
    return fig
