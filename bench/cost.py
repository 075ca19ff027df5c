"""What keeping the cost and provenance records costs the collector (issue 41: at most 5%).

    .venv/bin/python bench/cost.py [--rollouts 2000] [--concurrency 256] [--repeats 5]
                                   [--variant proxy]

Every record's line gets ``rollgym_cost`` and ``rollgym_fingerprint``
(``rollgym.collect.spend.RunSpend.stamp``, called by the ledger as it writes the line), and
the run ends with ``cost.json`` (``rollgym.collect.cost_ledger``: one pass over the run's
files). Two figures, each against a baseline measured in the same invocation:

1. **collector CPU, with vs without**: the servers are real processes
   (``harness.start_pipeline``: the proxy variant by default, so every line has real token
   counts); the collector runs here, once as it is, once with the stamp removed from its ledger
   (``ledger.stamp = None``: no fingerprint id, no cost ledger kept; the agent still sends its
   ``rollgym_cost``, whose reading (2) measures), alternating; its CPU over the dispatch window
   (``metrics.json``'s ``timing.cpu_seconds``, per rollout), paired medians;
2. **the records alone**: the lines of a real run read back (as the agent's answers are) and
   written again through the ledger, with the stamp and the new fields and without either, best
   of several passes: microseconds per record (the stamp keeps ``cost.json``'s ledger as it
   goes), as a share of the collector's whole CPU per rollout from (1); and, apart, the fold of
   the ledger from a run's files, per rollout: what ``--resume`` and ``rollgym report`` pay
   once, never a fresh run.

Without a price table or a budget (the default) the collector adds only the fingerprint id to
each line: the cost is summed by the agent, where it was measured. A price table adds the
money per record (an opt-in).

Written to ``bench/results/cost.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import orjson
from harness import Pipeline

from rollgym import runtime
from rollgym.collect import Collector, prepare_run
from rollgym.collect.cost_ledger import cost_ledger
from rollgym.collect.ledger import Ledger
from rollgym.collect.records import ScoredRollout
from rollgym.collect.spend import RunSpend
from rollgym.http import HttpClient

MODES = ("with", "without")


async def one_run(pipe: Pipeline, mode: str, tasks: Path, out: Path, concurrency: int) -> float:
    """Collector CPU ms per rollout of one run."""
    assert pipe.config is not None and isinstance(pipe.client, HttpClient)
    collect = pipe.config.collect.model_copy(update={"concurrency": concurrency})
    prepared = prepare_run(pipe.config, collect, tasks, out, resume=False)
    collector = Collector(
        prepared, harness.rollgym_urls(pipe), agent="agent", progress=False, client=pipe.client
    )
    if mode == "without":
        collector.ledger.stamp = None
    outcome = await collector.execute()
    assert outcome.metrics["counts"]["failed"] == 0, outcome.metrics["failures"]
    return 1000 * outcome.metrics["timing"]["cpu_seconds"] / prepared.total


def stamp_alone(run_dir: Path, passes: int = 5) -> dict[str, float]:
    """Microseconds per record, best of ``passes``: the answer read (``orjson.loads`` of the
    line: the agent's answer carries its ``rollgym_cost``) and the record written through the
    ledger, with the stamp and the fields, and without either (the lines as they were before);
    and the ledger's fold from the run's files, per rollout."""
    variants: dict[str, list[tuple[bytes, ScoredRollout]]] = {m: [] for m in MODES}
    added = ("rollgym_cost", "rollgym_fingerprint")
    for raw in (run_dir / "rollouts.jsonl").read_bytes().splitlines():
        line = orjson.loads(raw)
        for mode in MODES:
            verified = line if mode == "with" else {k: v for k, v in line.items()
                                                     if k not in added}  # fmt: skip
            record = ScoredRollout(line["task_index"], line["rollout_index"], line["reward"], 1,
                                   line["duration_s"], verified)  # fmt: skip
            variants[mode].append((orjson.dumps(verified), record))
    best: dict[str, float] = {}
    for mode in MODES * passes:
        records = variants[mode]
        with tempfile.TemporaryDirectory(prefix="rollgym-bench-cost-") as tmp:
            ledger = Ledger(Path(tmp), len(records), 1)
            spend = RunSpend(None, None)
            spend.fingerprint_of = lambda i: "3f2a9c0d41be"
            ledger.stamp = spend.stamp if mode == "with" else None
            ledger.open()
            t0 = time.process_time()
            for i, (answer, record) in enumerate(records):
                orjson.loads(answer)
                ledger.add(ScoredRollout(i, 0, record.reward, 1, record.duration_s,
                                         record.verified))  # fmt: skip
            took = (time.process_time() - t0) / len(records) * 1e6
            ledger.close()
        best[mode] = min(best.get(mode, took), took)
    t0 = time.process_time()
    for _ in range(passes):
        cost_ledger(run_dir, 1, None)
    best["ledger_pass"] = (time.process_time() - t0) / passes / len(records) * 1e6
    return {k: round(v, 2) for k, v in best.items()}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    harness.raise_fd_limit()
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rollouts": args.rollouts,
        "concurrency": args.concurrency,
        "variant": args.variant,
    }
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-cost-") as tmp:
        work = Path(tmp)
        tasks = harness.write_tasks(work / "tasks.jsonl", args.rollouts)
        warm = harness.write_tasks(work / "warm.jsonl", args.warmup)
        pipe = await harness.start_pipeline("rollgym", args.variant, log_dir=work / "logs")
        try:
            await one_run(pipe, "with", warm, work / "warm", args.concurrency)
            for i in range(args.repeats):
                for mode in MODES if i % 2 == 0 else tuple(reversed(MODES)):
                    cpu = await one_run(pipe, mode, tasks, work / f"{mode}-{i}", args.concurrency)
                    runs[mode].append(cpu)
                    print(f"run {i + 1}/{args.repeats} {mode:<8}: collector CPU {cpu:.3f} ms "
                          "per rollout", flush=True)  # fmt: skip
        finally:
            await pipe.stop()
        alone = stamp_alone(work / "with-0")
        line = orjson.loads((work / "with-0" / "rollouts.jsonl").read_bytes().splitlines()[0])
    ratios = sorted(a / b for a, b in zip(runs["with"], runs["without"], strict=True))
    median = {m: round(statistics.median(v), 4) for m, v in runs.items()}
    share = (alone["with"] - alone["without"]) / (1000 * median["without"])
    out.update(
        runs=runs,
        median_collector_cpu_ms_per_rollout=median,
        ratio_with_over_without=round(ratios[len(ratios) // 2], 4),
        stamp_us_per_record=alone,
        stamp_share_of_collector_cpu=round(share, 4),
        ledger_pass_share_of_collector_cpu=round(
            alone["ledger_pass"] / (1000 * median["without"]), 4
        ),
        cost_field_bytes=len(orjson.dumps(line["rollgym_cost"])),
        fingerprint_field_bytes=len(orjson.dumps({"rollgym_fingerprint": "3f2a9c0d41be"})) - 2,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=512)
    parser.add_argument("--variant", default="proxy", choices=harness.VARIANTS)
    args = parser.parse_args()
    r = runtime.run(main_async(args))
    median = r["median_collector_cpu_ms_per_rollout"]
    alone = r["stamp_us_per_record"]
    print(f"\n{args.rollouts} rollouts per run, concurrency {args.concurrency}, {args.variant}")
    print(f"  collector CPU per rollout: with {median['with']:.3f} ms, without "
          f"{median['without']:.3f} ms (medians of {args.repeats})")  # fmt: skip
    print(f"  with / without: x{r['ratio_with_over_without']:.4f} (paired median; target <= "
          "x1.05)")  # fmt: skip
    print(f"  the stamp alone: {alone['with'] - alone['without']:.1f} us per record "
          f"({alone['with']:.1f} with, {alone['without']:.1f} without): "
          f"{r['stamp_share_of_collector_cpu']:.2%} of the collector's CPU per rollout")  # fmt: skip
    print(f"  the ledger folded from a run's files (--resume, report): {alone['ledger_pass']:.1f} "
          f"us per rollout ({r['ledger_pass_share_of_collector_cpu']:.2%}; not on a fresh run)")  # fmt: skip
    print(f"  line size: rollgym_cost {r['cost_field_bytes']} bytes, rollgym_fingerprint "
          f"{r['fingerprint_field_bytes']} bytes")  # fmt: skip
    path = harness.save_json("cost.json", r)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
