"""A ``HealthReport`` for people: the terminal table, and the report page's section."""

from __future__ import annotations

import html

from rollgym.collect.metrics import CauseCounts
from rollgym.health.checks import CheckResult
from rollgym.health.run import HealthReport

EXAMPLES_SHOWN = 3
"""Examples printed under a failed check (health.json keeps more)."""


def _value(check: CheckResult) -> str:
    if check.value is None:
        return "-"
    if check.measure == "count":
        return str(check.count)
    return f"{check.value:.3f}"


def _threshold(check: CheckResult) -> str:
    return f"{check.threshold:g}"


def _of(check: CheckResult) -> str:
    return "" if check.of is None or check.value is None else f"{check.count}/{check.of}"


def headline(report: HealthReport) -> str:
    status = report.status or "no run.json"
    return (
        f"rollgym health: {report.root} ({status}; {report.rows} rows, {report.rollouts} "
        f"rollouts, {report.failures} failures)"
    )


def table(report: HealthReport) -> str:
    """The checks as an aligned plain-text table, then the failed checks' first examples and
    the warnings."""
    rows = [("check", "result", "value", "max", "n", "counts")]
    rows += [(c.id, c.outcome, _value(c), _threshold(c), _of(c), c.counts) for c in report.checks]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [headline(report)]
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:5])]
        lines.append("  ".join([*cells, row[5]]).rstrip())
    for check in report.checks:
        if check.outcome != "fail":
            continue
        lines.append(f"FAIL {check.id}: {_value(check)} > {_threshold(check)} ({check.counts})")
        lines += [f"  {e.where()}" for e in check.examples[:EXAMPLES_SHOWN]]
        if check.count > EXAMPLES_SHOWN and check.examples:
            lines.append(f"  ... {check.count - EXAMPLES_SHOWN} more (health.json lists some)")
    for check in report.checks:
        if check.detail.get("by_root"):  # failure_rate's: what the failures were
            lines.append(f"failures by root cause: {CauseCounts.of(check.detail).describe()}")
    lines += [_groups_line(c) for c in report.checks if c.id == "no_signal_groups" and c.of]
    lines += [f"warning: {w}" for w in report.warnings]
    judged = sum(c.outcome in ("pass", "fail") for c in report.checks)
    if report.failed:
        lines.append(f"health: {len(report.failed)} of {judged} judged checks failed: "
                     + ", ".join(report.failed))  # fmt: skip
    else:
        lines.append(f"health: all {judged} judged checks passed")
    return "\n".join(lines)


def _groups_line(check: CheckResult) -> str:
    """no_signal_groups in a line: the run's share, then each environment's."""
    d = check.detail
    envs = d.get("by_environment") or {}
    line = (f"groups without signal (rewards all equal): {d.get('no_signal')}/{d.get('groups')}"
            f" of tasks with {d.get('min_group')}+ scored rollouts")  # fmt: skip
    if len(envs) > 1:
        line += "; by environment: " + ", ".join(
            f"{name} {e['no_signal']}/{e['groups']}" for name, e in envs.items()
        )
    return line


_STYLE = {"pass": "#2a7", "fail": "#c33", "unobserved": "#888", "skipped": "#888"}


def html_section(report: HealthReport, name: str) -> str:
    """The report page's section for one run: its checks as a table, failures first."""
    order = {"fail": 0, "pass": 1, "unobserved": 2, "skipped": 3}
    cells = []
    for c in sorted(report.checks, key=lambda c: order[c.outcome]):
        first = c.examples[0].where() if c.outcome == "fail" and c.examples else ""
        cells.append(
            f'<tr><td>{html.escape(c.id)}</td><td style="color:{_STYLE[c.outcome]}">'
            f"<b>{c.outcome}</b></td><td>{html.escape(_value(c))}</td>"
            f"<td>{html.escape(_threshold(c))}</td><td>{html.escape(_of(c))}</td>"
            f"<td>{html.escape(c.counts)}</td><td>{html.escape(first)}</td></tr>"
        )
    verdict = (
        f"{len(report.failed)} failed: {', '.join(report.failed)}"
        if report.failed
        else "all passed"
    )
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings)
    return (
        f"<h2>Health: {html.escape(name)} ({html.escape(verdict)})</h2>"
        "<table><tr><th>check</th><th>result</th><th>value</th><th>max</th><th>n</th>"
        f"<th>counts</th><th>first example</th></tr>{''.join(cells)}</table>"
        + (f"<ul>{warnings}</ul>" if warnings else "")
    )


def html_unreadable(name: str, error: str) -> str:
    """The section for a run whose files cannot be read (``rollgym health`` exits 2)."""
    return f"<h2>Health: {html.escape(name)}</h2><p>Not checked: {html.escape(error)}</p>"
