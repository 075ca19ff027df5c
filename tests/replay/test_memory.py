"""Replay's memory is bounded by what is in flight, not by the run: the replay process never
holds the plan, the replayed records or the report's entries at once, and the replay model
holds the plan entries of the rollouts it serves, never the plan."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import orjson
import pytest

from rollgym.config import ServerConfig
from rollgym.replay import Divergence, read_entries, replay
from rollgym.replay.model import ReplayModel
from rollgym.replay.plan import PlanEntry
from rollgym.replay.report import SHOWN, ReplayReport, ReportWriter, RolloutReplay
from rollgym.server.base import ServerContext
from tests.replay.support import record, script_row, write_config, write_rows

pytestmark = pytest.mark.timeout(180)

ENV = "tests.replay.envs:NondetEnv"


def _say(text: str, n: int) -> dict[str, object]:
    return {
        "type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }  # fmt: skip


def _peak(run: object) -> int:
    """The peak of the Python memory ``run()`` allocates beyond what was held before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_the_replay_model_holds_the_entries_in_flight_not_the_plan(tmp_path: Path) -> None:
    plan = tmp_path / "replay_plan.jsonl"
    big = "y" * 40_000
    with plan.open("wb") as out:  # 200 rollouts of 40 KB each: 8 MB of recorded outputs
        for i in range(200):
            entry = PlanEntry(f"{i}:0", f"{i}:3", [[_say(f"{i} {big}", i)], [_say("done", 0)]])
            out.write(entry.to_line())
    cfg = ServerConfig(kind="model", impl="rollgym.replay.model:ReplayModel",
                       options={"plan": str(plan), "keep": 4})  # fmt: skip
    ReplayModel(ServerContext("model", cfg))  # what a first one imports, not measured
    model: list[ReplayModel] = []
    held = _peak(lambda: model.append(ReplayModel(ServerContext("model", cfg))))
    assert held < 2_000_000, held  # an offset a rollout and a block read at a time: no output

    replay_model = model[0]

    def serve_all() -> None:
        for i in range(200):
            served = replay_model._served(f"{i}:0")
            assert served is not None and served.entry.parent == f"{i}:3"
            assert len(replay_model.kept) <= 4

    assert _peak(serve_all) < 2_000_000  # four entries held, each dropped when pushed out
    assert list(replay_model.kept) == ["196:0", "197:0", "198:0", "199:0"]
    # An entry pushed out is read again, whole, by either spelling of its id.
    again = replay_model._served("7-0-a2")
    assert again is not None and again.entry.turns[0][0]["content"][0]["text"] == f"7 {big}"
    assert replay_model._served("200:0") is None and replay_model._served("7:1") is None


def test_a_replay_never_holds_the_run(tmp_path: Path) -> None:
    # 200 rollouts whose answers are 30 KB each (their scripts as long): 18 MB of records, which
    # a replay that loaded its plan, its new records or its report whole would hold (parsed).
    pad = "z" * 30_000
    rows = [script_row(["stable"], answer=f"42 {i} {pad}") for i in range(200)]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    cfg = write_config(tmp_path / "config.yaml", ENV, concurrency=4)
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, tasks, source)).status == "completed"
    size = (source / "rollouts.jsonl").stat().st_size
    assert size > 12_000_000

    out = tmp_path / "replayed"
    reports: list[object] = []
    peak = _peak(lambda: reports.append(asyncio.run(replay(source, out, progress=False))[1]))

    # What is in flight (four rollouts), one record parsed at a time and the harness: well
    # under the run's size (about 2 MB here; the whole plan and records held were 16 MB).
    assert peak < size / 4, (peak, size)
    saved = orjson.loads((out / "replay.json").read_bytes())  # still one JSON document
    assert (saved["replayed"], saved["identical"], saved["diverged"]) == (200, 200, 0)
    entries = list(read_entries(out / "replay.json"))
    assert [e.to_dict() for e in entries] == saved["rollouts"]
    assert [e.rollout for e in entries] == [f"{i}:0" for i in range(200)]
    assert not (out / "replay.json.part").exists()


def test_the_report_is_written_entry_by_entry_and_reads_back(tmp_path: Path) -> None:
    for n in (0, 1, 25):
        path = tmp_path / f"r{n}" / "replay.json"
        path.parent.mkdir()
        writer = ReportWriter(ReplayReport("src", "out", fork_at=2), path)
        written = []
        for i in range(n):
            d = None if i % 5 == 0 else Divergence(i, "tool output", "a\nb", {"x": [i]}, 0)
            entry = RolloutReplay(f"{i}:1", f"{i}:0", "diverged" if d else "identical", d, 2, 1.0)
            writer.add(entry)
            written.append(entry)
        report = writer.close()
        saved = orjson.loads(path.read_bytes())
        assert saved["rollouts"] == [e.to_dict() for e in written]
        assert saved == {**report.summary(), "rollouts": saved["rollouts"]}
        assert list(read_entries(path)) == written == list(report.entries())
        diverged = [e for e in written if e.status != "identical"]
        assert (report.replayed, report.diverged) == (n, len(diverged))
        assert report.shown == diverged[:SHOWN]  # the terminal's rows: at most SHOWN held
        assert not path.with_name("replay.json.part").exists()
