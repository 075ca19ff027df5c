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


@pytest.mark.parametrize("page", _pages_that_run(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's ``file`` and ``run`` blocks, in order, in one directory, as a reader would."""
    for name in ("src", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
        "NO_COLOR": "1",
    }
    for block in blocks(page):
        if block.kind == "file":
            target = tmp_path / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
        elif block.kind == "run":
            _run(block, tmp_path, env)


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        script = cwd / f"block-{block.line}.py"
        argv = [sys.executable, str(script)]
    else:
        script = cwd / f"block-{block.line}.sh"
        argv = ["bash", "-eo", "pipefail", str(script)]
    script.write_text(block.body, encoding="utf-8")
    want = int(block.arg.removeprefix("exit=")) if block.arg else 0
    # Its own session: a block that starts servers in the background (`&`) leaves nothing
    # behind, since the whole group is ended once the block is done. The output goes to a
    # file, not a pipe, which those background servers would hold open.
    log = cwd / f"block-{block.line}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    out = log.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == want, (
        f"{block.where()} exited {proc.returncode}, not {want}:\n{block.body}\n--- output ---\n{out}"
    )
