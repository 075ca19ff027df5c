"""The README's 30-second example shows real output: tests/docs/demo_output.txt is what
`rollgym run` printed for `make demo`'s command, and this test runs the command again and
checks it prints the same thing, rates and times aside (the scripted model is deterministic,
so the rewards and pass@k are the same on every machine)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import ROOT

CAPTURE = ROOT / "tests" / "docs" / "demo_output.txt"
VARYING = [
    (re.compile(r"\d+(?:\.\d+)?/s"), "N/s"),  # the progress bar's rate
    (re.compile(r"\d+\.\d+s, \d+(?:\.\d+)? rollouts/s"), "Ts, N rollouts/s"),
    (re.compile(r"\d+:\d\d:\d\d"), "H:MM:SS"),
]


def shape(text: str) -> list[str]:
    for pattern, stand_in in VARYING:
        text = pattern.sub(stand_in, text)
    # A rate of another width pads the table's cells differently: compare the words alone.
    text = re.sub(r"─+", "─", re.sub(r" +", " ", text))
    return [line.strip() for line in text.strip().splitlines()]


def test_the_readme_shows_the_demo_output() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "<!-- snippet: tests/docs/demo_output.txt -->" in readme


def test_the_demo_prints_what_the_readme_shows(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(ROOT / "src")
    rollgym = Path(sys.executable).parent / "rollgym"
    done = subprocess.run(
        [str(rollgym), "run", "src/rollgym/envs/lookup/config.yaml", "--output", "out/demo"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the progress bar is on stderr, the table on stdout
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout
    assert shape(done.stdout) == shape(CAPTURE.read_text(encoding="utf-8"))
