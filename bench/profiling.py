"""py-spy around a timed run: record every process, then rank functions by CPU samples.

``start`` launches one ``py-spy record --format raw`` (collapsed stacks, idle samples left out,
``--nonblocking`` so the profiled process is never paused) per process; ``stop`` ends them with
SIGINT, which makes py-spy write its file; ``summarize`` turns a collapsed-stack file into the
top functions by self and by inclusive share of the samples.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_LINE = re.compile(r":\d+\)$")
_SKIP = ("process ", "thread ")


def _py_spy() -> str:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy") or "py-spy"


def start(
    pids: dict[str, int], out_dir: Path, tag: str, rate: int = 250
) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    spies = []
    for name, pid in {"collector": os.getpid(), **pids}.items():
        path = out_dir / f"{tag}-{name}.txt"
        args = ["record", "--pid", str(pid), "--format", "raw", "--rate", str(rate)]
        proc = subprocess.Popen(
            [_py_spy(), *args, "--nonblocking", "-o", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        spies.append((name, proc, path))
    return spies


def stop(spies: list[tuple[str, subprocess.Popen[bytes], Path]]) -> dict[str, Any]:
    """Stop the recorders (idempotent) and summarize what they wrote."""
    out: dict[str, Any] = {}
    for _, proc, _ in spies:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for name, proc, path in spies:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if path.exists():
            out[name] = {"file": str(path), **summarize(path)}
    spies.clear()
    return out


def _frame(raw: str) -> str:
    return _LINE.sub(")", raw.strip())


def summarize(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares of the functions in a collapsed-stack file."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";") if not f.startswith(_SKIP)]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
        modules[_module(frames[-1])] += count

    def pct(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)] if total else []

    return {
        "samples": total,
        "self": pct(own),
        "inclusive": pct(inclusive),
        "self_by_package": pct(modules),
    }


def _module(frame: str) -> str:
    """The package a frame's file belongs to: ``rollgym/http``, ``aiohttp``, ``asyncio``, ..."""
    match = re.search(r"\((.*)\)$", frame)
    where = match.group(1) if match else frame
    parts = where.replace("\\", "/").split("/")
    if "site-packages" in parts:
        rest = parts[parts.index("site-packages") + 1 :]
    elif "rollgym" in parts:
        rest = parts[parts.index("rollgym") :]
    else:
        rest = parts[-2:]
    if rest and rest[0] == "rollgym" and len(rest) > 2:
        return "/".join(rest[:2])
    return rest[0] if rest else where


def print_top(profiles: dict[str, Any], tag: str, n: int = 12) -> None:
    for name, prof in profiles.items():
        print(f"\n== py-spy, {tag} / {name}: {prof['samples']} samples ({prof['file']})")
        print("  by package (self): " + ", ".join(f"{k} {v}%" for k, v in prof["self_by_package"]))
        print("  top self:")
        for fn, share in prof["self"][:n]:
            print(f"    {share:5.1f}%  {fn}")
        print("  top inclusive:")
        for fn, share in prof["inclusive"][:n]:
            print(f"    {share:5.1f}%  {fn}")
