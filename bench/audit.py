"""``rollgym audit`` seconds per bundled environment, for 8 rows (issue 39: at most 60 s each
on this 2-core machine).

    .venv/bin/python bench/audit.py              # every src/rollgym/envs/*/config.yaml
    .venv/bin/python bench/audit.py math code    # some of them

Each config is audited as the command does it: its servers started as processes (their start
is not counted: ``seconds`` is the audit's own time, per server), the panel played with the
default timeout and concurrency. Printed: environment, verdict, plays, seconds.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from rollgym.audit.run import audit_config
from rollgym.config import load_config

ENVS = Path(__file__).resolve().parents[1] / "src" / "rollgym" / "envs"


async def main(names: list[str]) -> None:
    configs = sorted(ENVS.glob("*/config.yaml"))
    print(f"{'environment':<16} {'verdict':<12} {'plays':>6} {'seconds':>8}")
    for path in configs:
        if names and path.parent.name not in names:
            continue
        with tempfile.TemporaryDirectory() as logs:
            report = await audit_config(load_config(path), limit=8, log_dir=Path(logs))
        for audit in report.servers.values():
            print(
                f"{path.parent.name:<16} {audit.verdict:<12} {audit.plays:>6} {audit.seconds:>8.2f}"
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
