"""Which of the agent's filesystem changes could sway the verifier: computed on the host from the
container's ``ChangeSet`` (read from its overlay, ``containers.changes``), never by a program in
the container.

What the verifier trusts and the agent may still change (the system trees are not carried into
the verifier, ``trial.SYSTEM_TREES``, so these are the ways left):
- files Python or a shell loads at start: ``sitecustomize.py``, ``usercustomize.py``, ``.pth``
  files (a user site, a virtualenv), ``/etc/profile``, ``.bashrc`` and the like;
- pytest's configuration and plugins: every ``conftest.py``, ``pytest.ini``, a ``tox.ini``,
  ``setup.cfg`` or ``pyproject.toml`` holding a pytest section, pytest's own packages wherever
  installed (a virtualenv outside ``/usr``);
- a program added to or changed in a ``bin`` directory outside ``/usr`` (a virtualenv's
  ``python``, ``~/.local/bin``): a test script may call it by a name PATH finds there;
- a module of the standard library's or pytest's name in the directory ``test.sh`` starts in
  (``python3 -m pytest`` puts it first on ``sys.path``: a review's ``/app/iniconfig.py`` calling
  ``os._exit(0)`` passed every test).

These flag (``integrity_suspect``); they do not prevent: the task's own work may be exactly such
a change (a repository's ``conftest.py``).
"""

from __future__ import annotations

import sys
import tarfile

from rollgym.containers.runtime import ChangeSet

STARTUP_NAMES = frozenset({
    "conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", ".pytest.ini",
    ".gitconfig",
})  # fmt: skip
STARTUP_FILES = frozenset({
    "/etc/profile", "/etc/bash.bashrc", "/etc/environment", "/root/.bashrc", "/root/.profile",
    "/root/.bash_profile", "/root/.bash_login",
})  # fmt: skip
CONFIG_NAMES = {
    "tox.ini": (b"[pytest]",),
    "setup.cfg": (b"[tool:pytest]",),
    "pyproject.toml": (b"[tool.pytest",),
}
"""Files that configure pytest only when they hold one of these sections (read from the
archive: a repository's own ``pyproject.toml`` changed for another reason is no suspect)."""
PROGRAM_ROOTS = ("/root/", "/home/", "/opt/", "/usr/")
"""Where a ``bin`` directory is one a PATH may name (with any ``*venv/bin``); a repository's own
``bin/`` elsewhere is the task's work."""
TEST_PACKAGES = ("/pytest/", "/_pytest/", "/pluggy/", "/py.py", "/pytest.py")
CONFIG_READ_MAX = 1 << 20
SHADOWABLE = (
    frozenset(sys.stdlib_module_names) - {"test", "idlelib", "turtledemo", "this", "antigravity"}
) | {
    "pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "exceptiongroup", "tomli",
    "colorama", "pygments",
}  # fmt: skip
"""Module names that a file in ``test.sh``'s starting directory would shadow."""


def suspect_paths(
    changes: ChangeSet, *, carried_system: tuple[str, ...] = (), workdir: str = "/app"
) -> list[str]:
    """The kept changes that could sway the verifier, sorted: ``+path`` added or changed,
    ``-path`` deleted. ``carried_system`` are system paths carried into the verifier (a task
    that keeps them): each of them is suspect too. ``workdir``: where ``test.sh`` starts."""
    found = {f"+{p}" for p in changes.changed if _suspect(p) or _shadows(p, workdir)}
    found |= {f"-{p}" for p in changes.deleted if _suspect(p)}
    found |= {f"+{p}" for p in carried_system if not _bytecode(p)}
    configs = [p for p in changes.changed if p.rsplit("/", 1)[-1] in CONFIG_NAMES]
    if configs:
        found |= {f"+{p}" for p in _pytest_configs(changes, configs)}
    return sorted(found, key=lambda s: s[1:])


def _shadows(path: str, workdir: str) -> bool:
    """A module (``name.py``, a package's ``name/__init__.py``) of a shadowable name right in
    ``workdir``."""
    base = workdir.rstrip("/") + "/"
    if not path.startswith(base):
        return False
    rest = path[len(base) :]
    if rest.endswith("/__init__.py"):
        name = rest.removesuffix("/__init__.py")
    elif rest.endswith(".py"):
        name = rest.removesuffix(".py")
    else:
        return False
    return "/" not in name and name in SHADOWABLE


def _bytecode(path: str) -> bool:
    return path.endswith(".pyc") or path.endswith("/__pycache__")


def _suspect(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    if name in STARTUP_NAMES or name.endswith(".pth") or path in STARTUP_FILES:
        return True
    if path.startswith("/etc/profile.d/"):
        return True
    parent = path.rsplit("/", 2)[-2] if path.count("/") >= 2 else ""
    if parent in ("bin", "sbin") and (path.startswith(PROGRAM_ROOTS) or "venv/bin/" in path):
        return True
    return not _bytecode(path) and any(part in path for part in TEST_PACKAGES)


def _pytest_configs(changes: ChangeSet, paths: list[str]) -> list[str]:
    """Those of ``paths`` (tox.ini, setup.cfg, pyproject.toml) whose new content configures
    pytest."""
    wanted = {p.lstrip("/"): p for p in paths}
    found = []
    with tarfile.open(changes.archive, "r") as tar:
        for member in tar:
            path = wanted.get(member.name)
            if path is None or not member.isreg():
                continue
            data = tar.extractfile(member)
            head = data.read(CONFIG_READ_MAX) if data is not None else b""
            if any(mark in head for mark in CONFIG_NAMES[path.rsplit("/", 1)[-1]]):
                found.append(path)
    return found
