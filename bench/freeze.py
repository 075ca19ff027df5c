"""Freeze benchmark: how long a run goes on after its only model server freezes.

    .venv/bin/python bench/freeze.py [--kind process|engine|both] [--rollouts 200] \
        [--concurrency 64] [--generate-seconds 2] [--freeze-at 20] [--cap 300]
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/freeze.py   # the same against other code

The vLLM-shaped double (``tests/models/vllm_double.py``) runs as a process of its own, each
answer's tokens spread over ``--generate-seconds`` (its ``vllm:generation_tokens_total`` moving
token by token). In front of it, ``rollgym run`` with default settings: ``openai_proxy`` -> the
echo environment -> ``tool_agent`` (two model calls per rollout). Once ``--freeze-at`` rollouts
are recorded, the double is frozen:

- ``process``: ``SIGSTOP`` of its whole process (a wedged vLLM: the kernel still takes
  connections, nothing answers, ``/ping`` included);
- ``engine``: its engine stops generating while its server answers (``/ping`` 200; its token
  counters stand still with requests running).

Prints, per kind, the seconds from the freeze to the end of ``rollgym run`` (or that it was
still running after ``--cap`` seconds), its exit code, how the run ended and why, and the
failures by root type. ``rollgym`` runs as a child process, so ``PYTHONPATH`` picks the code
under test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ROOT / "tests" / "models" / "vllm_double.py"
# The run's inputs, shared with the freeze tests (that module imports nothing of rollgym).
sys.path.insert(0, str(ROOT))
from tests.support.echo_run import recorded, write_echo_run  # noqa: E402


def root_type(error: dict) -> str:
    from rollgym.errors import root_record

    return str(root_record(error).get("type"))


async def one(kind: str, args: argparse.Namespace) -> None:
    double = await asyncio.create_subprocess_exec(
        sys.executable, str(DOUBLE), "--generate-seconds", str(args.generate_seconds),
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert double.stdout is not None
    port = int(await double.stdout.readline())
    upstream = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="rollgym-freeze-") as tmp:
            workdir = Path(tmp)
            config = write_echo_run(workdir, upstream, args.rollouts, args.concurrency)
            out = workdir / "out"
            code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
            run = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, "run", str(config), "--output", str(out),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                env=os.environ,
            )  # fmt: skip
            # Polls the run's files: they are the run's own record of progress.
            while recorded(out) < args.freeze_at and run.returncode is None:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            frozen_at = time.monotonic()
            at = recorded(out)
            if kind == "process":
                double.send_signal(signal.SIGSTOP)
            else:
                async with aiohttp.ClientSession() as http:
                    await http.post(upstream + "/control", json={"engine_stalled": True})
            try:
                await asyncio.wait_for(run.wait(), timeout=args.cap)
                took = f"{time.monotonic() - frozen_at:.1f} s"
            except TimeoutError:
                took = f"still running after {args.cap:g} s"
                run.kill()
                await run.wait()
            info = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
            failures = [
                json.loads(line)
                for line in (out / "failures.jsonl").read_text().splitlines()
                if line.strip()
            ] if (out / "failures.jsonl").exists() else []  # fmt: skip
            by_root: dict[str, int] = {}
            for failure in failures:
                name = root_type(failure["error"])
                by_root[name] = by_root.get(name, 0) + 1
            abort = info.get("abort") or {}
            print(f"-- freeze: {kind} (after {at} of {args.rollouts} rollouts recorded, "
                  f"concurrency {args.concurrency})")  # fmt: skip
            print(f"run ended {took} after the freeze; exit code {run.returncode}; "
                  f"status {info.get('status')}")  # fmt: skip
            print(f"recorded {recorded(out)} of {args.rollouts}; failures by root type {by_root}")
            if abort:
                print(f"abort: {abort.get('reason')}")
                sample = abort.get("sample_error") or {}
                print(f"  cause: {sample.get('type')}: {sample.get('message')}")
    finally:
        if double.returncode is None:
            double.send_signal(signal.SIGCONT)
            double.kill()
            await double.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=("process", "engine", "both"), default="both")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--generate-seconds", type=float, default=2.0)
    parser.add_argument("--freeze-at", type=int, default=20)
    parser.add_argument("--cap", type=float, default=300.0)
    args = parser.parse_args()
    print(f"rollgym from: {os.environ.get('PYTHONPATH') or 'this checkout (installed)'}")
    for kind in ("process", "engine") if args.kind == "both" else (args.kind,):
        await one(kind, args)


if __name__ == "__main__":
    asyncio.run(main())
