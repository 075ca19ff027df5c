"""A reader's clone for the doc blocks, and what a block leaves behind in it.

The blocks of a page run as a reader pastes them at the root of a fresh clone: ``src``,
``examples`` and ``.venv`` are there (links into the checkout), git ignores what the
checkout's ``.gitignore`` ignores. A block must leave behind no process and no untracked file,
and what it writes to ignored places must be under ``out/<page>/``: so two pages never share
an output directory (``--output out`` twice fails), whatever order a reader follows them in.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import psutil

from tests.docs.blocks import ROOT

LINKED = ("src", "examples")
SETTLE = 10.0  # seconds a block's processes get to end after it (a `kill %1` just sent)


def make_clone(where: Path, venv: Path) -> None:
    """Lay out ``where`` as a reader's clone: the checkout's code linked in, git ignoring what
    the checkout ignores."""
    where.mkdir(parents=True)
    for name in LINKED:
        (where / name).symlink_to(ROOT / name)
    (where / ".venv").symlink_to(venv)
    subprocess.run(["git", "init", "-q", str(where)], check=True, timeout=30)
    # In .git/info/exclude, not a .gitignore of its own: the clone holds no file the reader
    # did not make.
    exclude = (ROOT / ".gitignore").read_text(encoding="utf-8")
    (where / ".git" / "info" / "exclude").write_text(exclude, encoding="utf-8")


def status(clone: Path) -> dict[str, str]:
    """Every untracked (``??``) and ignored (``!!``) file of the clone, path -> code."""
    out = subprocess.run(
        ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored"],
        cwd=clone,
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout.decode()
    return {entry[3:]: entry[:2] for entry in out.split("\0") if entry}


def left_files(clone: Path, before: dict[str, str], page: str) -> list[str]:
    """What a block left that it must not: a new untracked file, or an ignored one outside
    ``out/<page>/`` (``__pycache__`` aside: Python's, for a module the reader wrote)."""
    problems = []
    for path, code in sorted(status(clone).items()):
        if path in before or "__pycache__/" in path:
            continue
        if code == "??":
            problems.append(f"{path} (untracked)")
        elif not path.startswith(f"out/{page}/"):
            problems.append(f"{path} (not under out/{page}/)")
    return problems


def block_processes(session: int, clone: Path) -> list[psutil.Process]:
    """The processes a block started and left: those of its session (it ran in its own),
    those working in the clone (a server starts a session of its own), and their children."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cwd"]):
        with contextlib.suppress(psutil.Error, OSError):
            cwd = proc.info["cwd"]
            inside = cwd is not None and Path(cwd).is_relative_to(clone)
            if inside or os.getsid(proc.pid) == session:
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
    return [p for p in found.values() if _running(p)]


def settle(session: int, clone: Path, grace: float = SETTLE) -> list[str]:
    """Wait up to ``grace`` seconds for the block's processes to end; kill those that do not
    and return their command lines (empty: the block left nothing running)."""
    deadline = time.monotonic() + grace
    left = block_processes(session, clone)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = block_processes(session, clone)
    names = []
    for proc in left:
        with contextlib.suppress(psutil.Error):
            names.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    return names


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
