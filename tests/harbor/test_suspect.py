"""Which carried changes flag a trial, computed on the host from the change list and its archive
(no container): the shapes two independent reviews paid themselves with, beside honest work
that must stay unflagged (a flag is read as an exploit and masked)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from rollgym.containers.runtime import ChangeSet
from rollgym.harbor.suspect import suspect_paths


def changes(tmp_path: Path, files: list[str], links: dict[str, str] | None = None) -> ChangeSet:
    archive = tmp_path / "changes.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in files:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        for path, target in (links or {}).items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    every = (*files, *(links or {}))
    return ChangeSet(archive=archive, changed=tuple(every), deleted=(), opaque=(), dropped=())


def test_module_shadows_in_the_start_directory_in_every_import_form(tmp_path: Path) -> None:
    forged = [
        "/app/iniconfig.py", "/app/iniconfig.pyc", "/app/json/__init__.py",
        "/app/iniconfig.cpython-311-x86_64-linux-gnu.so", "/app/_pytest.abi3.so",
        "/app/__pycache__/os.cpython-311.pyc", "/app/pluggy/_hooks.py",
    ]  # fmt: skip
    honest = ["/app/calc.py", "/app/__pycache__/calc.cpython-311.pyc", "/app/sub/json.py"]
    found = suspect_paths(changes(tmp_path, forged + honest), workdir="/app")
    assert found == sorted(f"+{p}" for p in forged)


def test_installed_packages_outside_usr_are_flagged_bytecode_too(tmp_path: Path) -> None:
    forged = [
        "/root/.local/lib/python3.11/site-packages/iniconfig.py",
        "/root/.local/lib/python3.11/site-packages/evil-1.0.dist-info/entry_points.txt",
        "/opt/venv/lib/python3.11/site-packages/iniconfig/__init__.py",
        "/opt/venv/lib/python3.11/site-packages/_pytest/__pycache__/main.cpython-311.pyc",
    ]
    found = suspect_paths(changes(tmp_path, forged), workdir="/app")
    assert found == sorted(f"+{p}" for p in forged)


def test_tool_configuration_in_homes_and_git_repositories_is_flagged(tmp_path: Path) -> None:
    forged = [
        "/root/.config/git/config", "/root/.curlrc", "/home/u/.config/pip/pip.conf",
        "/app/.git/config", "/app/.git/hooks/pre-commit", "/root/.gitconfig",
    ]  # fmt: skip
    honest = [
        "/root/.cache/pip/http/x", "/root/.bash_history", "/app/.git/objects/ab/cdef",
        "/root/notes.txt", "/app/README.md",
    ]  # fmt: skip
    found = suspect_paths(changes(tmp_path, forged + honest), workdir="/app")
    assert found == sorted(f"+{p}" for p in forged)


def test_links_into_the_verifiers_trees_are_flagged_through_other_links(tmp_path: Path) -> None:
    links = {
        "/app/answer.txt": "/tests/expected.txt",  # the answer is the expected answer
        "/app/out.txt": "../logs/verifier/reward.json",  # output written to the reward
        "/app/root": "/proc/self/root",  # the root, through /proc
        "/app/a": "/",  # a link to / ...
        "/app/b": "a/solution/solve.sh",  # ... followed by another
        "/app/ok": "calc.py",  # honest
        "/app/etc-link": "/etc/hostname",  # honest
    }
    found = suspect_paths(changes(tmp_path, [], links), workdir="/app")
    assert found == sorted(
        f"+{p}" for p in ("/app/answer.txt", "/app/out.txt", "/app/root", "/app/b")
    )
