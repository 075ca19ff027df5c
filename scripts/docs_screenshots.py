"""Re-take docs/report.png: `rollgym report` of the demo run (`make demo`'s command), rendered
in headless Chromium (the browser driver of tests/report, which checks the same page renders
with no error and no network request).

    python scripts/docs_screenshots.py      # needs chromium: apt-get install -y chromium

The terminal picture (docs/images/terminal-demo.svg) is made by scripts/gen_reference.py.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.report.browser import find_chromium, render  # noqa: E402
from tests.report.test_report import PROBE  # noqa: E402


def main() -> int:
    chromium = find_chromium()
    if chromium is None:
        print("no chromium: apt-get install -y chromium (or set ROLLGYM_CHROMIUM)", file=sys.stderr)
        return 2
    bin_dir = Path(sys.executable).parent
    out = ROOT / "out" / "demo"
    shutil.rmtree(out, ignore_errors=True)
    config = "src/rollgym/envs/lookup/config.yaml"
    subprocess.run(
        [bin_dir / "rollgym", "run", config, "--output", "out/demo"], cwd=ROOT, check=True
    )
    subprocess.run([bin_dir / "rollgym", "report", "out/demo"], cwd=ROOT, check=True)
    got = asyncio.run(render(chromium, out / "report.html", PROBE, ROOT / "docs" / "report.png"))
    if got.errors or not all(u.startswith(("file://", "data:")) for u in got.requests):
        print(f"the report did not render cleanly: {got.errors} {got.requests}", file=sys.stderr)
        return 1
    print("wrote docs/report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
