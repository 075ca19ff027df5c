"""A real stack for scraping: ``rollgym serve`` (three server processes) and ``rollgym collect
--metrics-port 0`` against it, with every model call held (the ``FaultyModel``'s hold file)
until the test lets them go, so the run is alive, with a known number of rollouts in flight,
for as long as the test scrapes it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from tests.support.stack import stack_data, write_tasks
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}
ROLLOUTS = 6
CONCURRENCY = 3


@dataclass
class HeldRun:
    servers: dict[str, str]
    """Server name -> base URL."""
    collector: str
    """The collector's metrics URL, as it printed it."""
    hold: Path
    collect: subprocess.Popen[str]
    out: Path
    stderr: list[str] = field(default_factory=list)

    def release(self, timeout: float = 60.0) -> int:
        """Let the model answer; the collector's exit code once the run is done."""
        self.hold.unlink()
        return self.collect.wait(timeout)


def _popen(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ROLLGYM, *map(str, args)], env=ENV, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def held_run(tmp_path: Path) -> Iterator[HeldRun]:
    hold = tmp_path / "hold"
    hold.touch()
    model = {
        "impl": "tests.support.servers:FaultyModel",
        "options": {"hold_while_exists": str(hold)},
    }
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(stack_data({"concurrency": CONCURRENCY}, model=model)))
    tasks = write_tasks(tmp_path / "tasks.jsonl", ROLLOUTS)
    urls_file = tmp_path / "urls.json"
    serve = _popen("serve", cfg, "--write-urls", urls_file)
    collect: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: urls_file.exists() or serve.poll() is not None, 60, "serve's URLs")
        assert serve.poll() is None, serve.communicate()
        urls = {name: got[0] for name, got in orjson.loads(urls_file.read_bytes()).items()}
        out = tmp_path / "out"
        collect = _popen(
            "collect", cfg, "--servers", urls_file, "-i", tasks, "-o", out, "--no-progress",
            "--metrics-port", "0",
        )  # fmt: skip
        stderr: list[str] = []
        assert collect.stderr is not None
        pipe = collect.stderr
        threading.Thread(target=lambda: stderr.extend(pipe), daemon=True).start()
        printed = "collector metrics: "

        def url_printed() -> bool:
            return any(printed in line for line in stderr) or collect.poll() is not None

        wait_for(url_printed, 60, "the collector's metrics URL")
        line = next((x for x in stderr if printed in x), None)
        assert line is not None, "".join(stderr)
        run = HeldRun(urls, line.split(printed, 1)[1].strip(), hold, collect, out, stderr)
        yield run
    finally:
        if hold.exists():
            hold.unlink()
        if collect is not None:
            _stop(collect)
        _stop(serve)
