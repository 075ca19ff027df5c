"""Every example in the docs runs, or says why it cannot: see tests/docs/blocks.py for the
markers. An unmarked block fails here, so a doc cannot drift from the code."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollgym.config import parse_config
from tests.docs.blocks import ROOT, Block, all_blocks, blocks, pages
from tests.docs.reader import left_files, make_clone, settle, status

RUNNABLE = {"bash", "sh", "python"}
BLOCK_TIMEOUT = 90.0  # seconds one runnable block may take (every one here takes a few)


def test_every_block_is_marked() -> None:
    unmarked = [b.where() for b in all_blocks() if b.kind is None]
    assert not unmarked, (
        "code blocks without a marker (<!-- run -->, <!-- snippet: PATH -->, <!-- file: NAME -->, "
        "<!-- config -->, <!-- not-run: REASON -->; see tests/docs/blocks.py): "
        + ", ".join(unmarked)
    )


def test_markers_are_well_formed() -> None:
    problems = []
    for b in all_blocks():
        if b.kind == "not-run" and len(b.arg) < 10:
            problems.append(f"{b.where()}: not-run needs a reason")
        if b.kind == "run" and b.lang not in RUNNABLE:
            problems.append(f"{b.where()}: run marks a {b.lang or 'plain'} block")
        if b.kind == "run" and b.arg and not b.arg.startswith("exit="):
            problems.append(f"{b.where()}: run takes only exit=N")
        if b.kind in ("file", "snippet") and not b.arg:
            problems.append(f"{b.where()}: {b.kind} needs a path")
    assert not problems, "\n".join(problems)


def test_the_docs_have_runnable_blocks() -> None:
    kinds = {b.kind for b in all_blocks()}
    assert {"run", "snippet", "config", "not-run"} <= kinds


@pytest.mark.parametrize(
    "block",
    [b for b in all_blocks() if b.kind == "config"],
    ids=lambda b: b.where(),
)
def test_a_config_block_is_a_valid_config(block: Block) -> None:
    import yaml

    parse_config(yaml.safe_load(block.body), source=block.where())


@pytest.mark.parametrize(
    "block",
    [b for b in all_blocks() if b.kind == "snippet"],
    ids=lambda b: b.where(),
)
def test_a_snippet_is_its_file_exactly(block: Block) -> None:
    file = ROOT / block.arg
    assert file.is_file(), f"{block.where()} names {block.arg}, which does not exist"
    assert block.body == file.read_text(encoding="utf-8"), (
        f"{block.where()} differs from {block.arg}"
    )


def _pages_that_run() -> list[Path]:
    return [p for p in pages() if any(b.kind == "run" for b in blocks(p))]


def test_pages_that_run_have_output_dirs_of_their_own() -> None:
    """A page's outputs go under out/<its name>/ (checked as it runs), so names must differ."""
    names = [p.stem for p in _pages_that_run()]
    assert len(names) == len(set(names)), sorted(names)


@pytest.mark.parametrize("page", _pages_that_run(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's ``file`` and ``run`` blocks, in order, at the root of a fresh clone, as a
    reader would paste them; each ``run`` block leaves no process running and nothing
    untracked, and writes only under ``out/<page>/`` (tests/docs/reader.py)."""
    clone, scripts = tmp_path / "clone", tmp_path / "blocks"
    make_clone(clone, Path(sys.prefix))
    scripts.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
        "NO_COLOR": "1",
    }
    known = status(clone)
    for block in blocks(page):
        if block.kind == "file":
            target = clone / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
            known = status(clone)  # the reader's own file, theirs to keep
        elif block.kind == "run":
            _run(block, clone, scripts, env)
            left = left_files(clone, known, page.stem)
            assert not left, f"{block.where()} left behind: {', '.join(left)}"
            known = status(clone)


def _run(block: Block, cwd: Path, scripts: Path, env: dict[str, str]) -> None:
    # The block's script and output live beside the clone, not in it: the clone holds only
    # what the block itself makes.
    if block.lang == "python":
        script = scripts / f"block-{block.line}.py"
        argv = [sys.executable, "-"]  # from stdin, as pasted: the clone's root on sys.path
    else:
        script = scripts / f"block-{block.line}.sh"
        argv = ["bash", "-eo", "pipefail", str(script)]
    script.write_text(block.body, encoding="utf-8")
    want = int(block.arg.removeprefix("exit=")) if block.arg else 0
    # Its own session, so what it starts can be found (and ended) once it is done. The output
    # goes to a file, not a pipe, which background servers would hold open.
    log = scripts / f"block-{block.line}.log"
    with log.open("w") as sink, script.open("rb") as source:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=source if block.lang == "python" else subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        left = settle(proc.pid, cwd)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == want, (
        f"{block.where()} exited {proc.returncode}, not {want}:\n{block.body}\n--- output ---\n{out}"
    )
    assert not left, (
        f"{block.where()} left running (stop what it starts: `kill %1; wait`): "
        + "; ".join(left)
        + f"\n--- output ---\n{out}"
    )
