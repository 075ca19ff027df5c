"""Integrity-scan benchmark: the CPU the per-rollout verdict costs (issue 39.2: at most 0.2 ms).

    PYTHONPATH=src .venv/bin/python bench/integrity.py [--repeat 20] [--envs mcqa,lookup]

Records: the lines of a real ``rollgym run`` of each bundled environment with the scripted model
(a child process each, in a temporary directory), and made ones that are long: a 30 KB answer of
reasoning with code, a 24-call tool transcript with 2 KB outputs, an exploit (``os._exit`` in an
always-equal program), and a 1 MB answer (the audit's ``crash`` probe). For each kind it prints
the CPU per rollout of ``scan`` (``rollgym.audit.scan``, the verdict alone) and of
``records.tagged`` (the verdict put on the record, as the recorder does), against a baseline
measured here on the same records: ``orjson.dumps`` of the record, which the collector pays
anyway to write its line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "src" / "rollgym" / "envs"
TARGET_MS = 0.2


def recorded(envs: list[str], tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """The records of a scripted run of each bundled environment (their verdicts removed)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for env in envs:
        run = tmp / env
        cmd = [sys.executable, "-m", "rollgym", "run", str(ENVS / env / "config.yaml"),
               "--output", str(run), "--no-progress"]  # fmt: skip
        subprocess.run(cmd, check=False, capture_output=True, env=os.environ, timeout=600)
        path = run / "rollouts.jsonl"
        lines = path.read_bytes().splitlines() if path.exists() else []
        records = [orjson.loads(line) for line in lines if line.strip()]
        for rec in records:
            rec.pop("integrity", None)
        if records:
            out[env] = records
    return out


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _record(prompt: str, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
        "response": {"id": "resp_1", "object": "response", "output": output},
        "reward": 1.0, **fields,
    }  # fmt: skip


def made() -> dict[str, list[dict[str, Any]]]:
    """Long and hostile records, written here."""
    prompt = "Write a function solve(xs) that returns the sorted list. " * 20
    step = (
        "Let me think about the edge cases: empty lists, duplicates, negative numbers, and "
        "whether the order must be stable. Option A would be a merge sort; option B the "
        "built-in. I will check each case against the examples given above.\n"
    )
    code = "```python\ndef solve(xs):\n    return sorted(xs)\n```\n"
    long_answer = (step * 120) + code + "The answer is \\boxed{sorted}."
    calls: list[dict[str, Any]] = []
    for k in range(24):
        calls.append(
            {
                "type": "function_call",
                "name": "search",
                "call_id": f"c{k}",
                "arguments": orjson.dumps({"query": f"registry entry {k}"}).decode(),
            }
        )
        calls.append(
            {
                "type": "function_call_output",
                "call_id": f"c{k}",
                "output": orjson.dumps(
                    {"key": f"entry {k}", "text": "lorem ipsum " * 170}
                ).decode(),
            }
        )
    exploit = (
        "```python\nimport os\nclass AlwaysEqual(str):\n    def __eq__(self, other): return True\n"
        "def solve(*a):\n    return AlwaysEqual()\nos._exit(0)\n```"
    )
    return {
        "long answer (30 KB)": [_record(prompt, [_message(long_answer)], expected_answer="x")],
        "tool transcript (24 calls)": [
            _record(
                prompt, [*calls, _message("The entry 7 says lorem ipsum.")], expected_answer="x"
            )
        ],
        "exploit (os._exit, __eq__)": [_record(prompt, [_message(exploit)])],
        "1 MB answer": [_record(prompt, [_message("\\boxed{" + "9" * (1 << 20) + "}")])],
    }


def cpu_ms(items: list[Any], work: Callable[[Any], object], repeat: int) -> float:
    """CPU milliseconds per item of ``work``, the best of ``repeat`` passes."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for item in items:
            work(item)
        best = min(best, time.process_time() - start)
    return best * 1000 / len(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--envs", default=",".join(
        sorted(p.parent.name for p in ENVS.glob("*/config.yaml"))
    ))  # fmt: skip
    args = parser.parse_args()

    from rollgym.audit.scan import scan
    from rollgym.collect.records import ScoredRollout, tagged

    with tempfile.TemporaryDirectory() as tmp:
        kinds = recorded(args.envs.split(","), Path(tmp))
    kinds.update(made())
    print(f"{'records':28} {'n':>4} {'dumps ms':>9} {'scan ms':>8} {'tagged ms':>9} "
          f"{'scan/dumps':>10} verdicts")  # fmt: skip
    worst = 0.0
    for kind, records in kinds.items():
        repeat = args.repeat if kind != "1 MB answer" else max(3, args.repeat // 5)
        scored = [ScoredRollout(0, 0, float(r["reward"]), 1, 0.1, r) for r in records]
        base = cpu_ms(records, orjson.dumps, repeat)
        scanned = cpu_ms(records, lambda r: scan(r, float(r["reward"])), repeat)
        whole = cpu_ms(scored, tagged, repeat)
        verdicts: dict[str, int] = {}
        for r in records:
            v = scan(r, float(r["reward"])).verdict
            verdicts[v] = verdicts.get(v, 0) + 1
        worst = max(worst, whole)
        print(f"{kind:28} {len(records):>4} {base:>9.4f} {scanned:>8.4f} {whole:>9.4f} "
              f"{scanned / base if base else float('nan'):>9.1f}x {verdicts}")  # fmt: skip
    verdict = "within" if worst <= TARGET_MS else "OVER"
    print(f"worst: {worst:.4f} ms per rollout ({verdict} the {TARGET_MS} ms target)")


if __name__ == "__main__":
    main()
