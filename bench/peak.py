"""Run a Python entry point and record its peak RSS (``VmHWM``) at exit.

    python bench/peak.py REPORT.json module.path:function [args...]
    python bench/peak.py REPORT.json path/to/script.py [args...]

Why not ``wait4``'s ``ru_maxrss``: a child started by ``subprocess`` (vfork + exec) carries the
parent's high-water mark over the exec, so every child of a 60 MiB benchmark would "peak" at
60 MiB at least. ``VmHWM`` in ``/proc/self/status`` belongs to the process's own address space.
"""

from __future__ import annotations

import atexit
import importlib
import runpy
import sys
from pathlib import Path


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def main() -> None:
    report, target, *rest = sys.argv[1:]

    def write() -> None:
        Path(report).write_text(
            f'{{"vm_hwm_kib": {_status_kib("VmHWM")}, "vm_rss_kib": {_status_kib("VmRSS")}}}'
        )

    atexit.register(write)
    if target.endswith(".py"):
        sys.argv = [target, *rest]
        sys.path.insert(0, str(Path(target).resolve().parent))
        runpy.run_path(target, run_name="__main__")
        return
    module, _, func = target.partition(":")
    sys.argv = [module.rsplit(".", 1)[-1], *rest]
    getattr(importlib.import_module(module), func)()


if __name__ == "__main__":
    main()
