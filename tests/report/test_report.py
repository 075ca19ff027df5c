"""``rollgym report``: the run read right whatever state it is in, one offline HTML file, and
(when Chromium is installed) every plot rendered in a real browser."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import orjson
import pytest

from rollgym.report import load_run, write_report
from tests.report.browser import find_chromium, render
from tests.report.runs import aborted_run, good_run
from tests.support.ledger import read_jsonl

pytestmark = pytest.mark.timeout(120)

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium: apt-get update && apt-get install -y chromium (or set ROLLGYM_CHROMIUM)",
)

# Every Bokeh figure of the page, once all have been drawn: its size and what it shows (glyphs
# with data, or the label of an empty plot). Null until Bokeh has rendered every root.
PROBE = """(() => {
  if (!window.Bokeh || !Bokeh.documents.length) return null;
  const roots = Bokeh.documents[0].roots().length;
  const figs = [...Bokeh.index.all_views()].filter(v => v.model.type === "Figure");
  if (figs.length < roots || !figs.every(v => v.has_finished())) return null;
  return figs.map(v => {
    const box = v.el.getBoundingClientRect();
    return {
      title: v.model.title.text, width: box.width, height: box.height,
      glyphs: v.model.renderers.filter(r => r.data_source && r.data_source.get_length() > 0).length,
      labels: v.model.center.filter(a => a.type === "Label").length,
    };
  });
})()"""


def test_a_completed_run_is_read_as_its_metrics_say(tmp_path: Path) -> None:
    out = asyncio.run(good_run(tmp_path))
    run = load_run(out)
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert run.status == "completed" and run.scored == 48 and run.pending == 0
    assert run.reward_mean() == pytest.approx(metrics["reward"]["mean"])
    assert {f"pass@{k}": v for k, v in run.pass_at().items()} == pytest.approx(metrics["pass_at_k"])
    assert [len(run.hops[h]) for h in ("seed", "model", "tool", "verify")] == [48, 96, 48, 48]
    assert len(run.ends) == 48


def test_an_aborted_run_still_being_written_is_read(tmp_path: Path) -> None:
    out = asyncio.run(aborted_run(tmp_path))
    failures = read_jsonl(out / "failures.jsonl")
    rollouts = read_jsonl(out / "rollouts.jsonl")
    # A run still writing: its last line is torn, and it has no metrics.json yet.
    with (out / "rollouts.jsonl").open("ab") as fh:
        fh.write(b'{"task_index": 99, "rollout_ind')
    (out / "metrics.json").unlink()
    run = load_run(out)
    assert run.status == "aborted"
    assert (run.scored, len(run.failures)) == (len(rollouts), len(failures))
    assert run.pending == run.total - len(rollouts) - len(failures) > 0
    assert run.failures.by_type == {"http_status": len(failures)}
    assert run.failures.by_server == {"model": len(failures)}
    assert run.failures.by_status == {"500": len(failures)}


def test_the_report_is_one_offline_file_with_every_plot(tmp_path: Path) -> None:
    good = asyncio.run(good_run(tmp_path))
    (tmp_path / "second").mkdir()
    other = asyncio.run(good_run(tmp_path / "second", n=12, repeats=2))
    made = write_report(good, [other])
    page = made.path.read_text()
    assert made.path == good / "report.html" and made.size == len(page.encode())
    assert "<script src=" not in page and "<link" not in page  # nothing to fetch
    assert page.count('data-root-id="') == 15  # every plot, the per-task deltas included
    # Two runs in directories of one name: labelled with their parents' names too.
    base, second = f"{tmp_path.name}/good", "second/good"
    assert f"Hardest tasks: {base}" in page and f"Hardest tasks: {second}" in page
    assert f"Per-task pass rate, {base} → {second}" in page
    assert base in made.summary and second in made.summary
    assert made.size < 2_000_000


async def _rendered(page: Path, screenshot: Path) -> list[dict[str, object]]:
    assert CHROMIUM is not None
    got = await render(CHROMIUM, page, PROBE, screenshot)
    assert len(await asyncio.to_thread(screenshot.read_bytes)) > 10_000
    assert got.errors == []
    assert all(u.startswith(("file://", "data:")) for u in got.requests), got.requests
    figures: list[dict[str, object]] = got.value
    for fig in figures:
        assert float(fig["width"]) > 100 and float(fig["height"]) > 100, fig  # type: ignore[arg-type]
        assert fig["glyphs"] or fig["labels"], fig  # data, or "no failures" said in the plot
    return figures


@needs_chromium
def test_the_report_of_a_run_renders_in_chromium(tmp_path: Path) -> None:
    out = asyncio.run(good_run(tmp_path))
    made = write_report(out)
    shot = tmp_path / "report.png"
    figures = asyncio.run(_rendered(made.path, shot))
    assert len(figures) == 14
    drawn = {f["title"] for f in figures if f["glyphs"]}
    assert {"Reward distribution", "pass@k against k", "Latency: model calls"} <= drawn
    if target := os.environ.get("ROLLGYM_REPORT_SCREENSHOT"):
        shutil.copy(shot, target)  # how docs/report.png is made


@needs_chromium
def test_the_report_of_an_aborted_fault_run_renders_in_chromium(tmp_path: Path) -> None:
    out = asyncio.run(aborted_run(tmp_path))
    made = write_report(out)
    figures = asyncio.run(_rendered(made.path, tmp_path / "aborted.png"))
    drawn = {f["title"] for f in figures if f["glyphs"]}
    assert {
        "Failures by root cause", "Failures by type", "Failures by server", "Failures by status"
    } <= drawn  # fmt: skip
