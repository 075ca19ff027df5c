"""The verifier's own tools, fingerprinted: what an agent would change to forge a test's result.

A test script trusts its shell, Python, pytest and whatever Python loads at start
(``sitecustomize.py``, ``usercustomize.py``, ``.pth`` files, every ``conftest.py`` on a test's
path). An agent that rewrites one of them can make any test pass. ``read_manifest`` lists them
inside a container, each with its inode change time, size, mode and type; ``changed_paths`` names
what differs from the prepared image.

The change time (ctime) is what makes this cheap and sound: any write, rename, chmod or
``touch -d`` sets it to now, and no process in the container can set it back (that needs the
clock, ``CAP_SYS_TIME``, which podman does not grant). A file untouched by the agent keeps its
image layer's ctime in the verifier's container. Reading 80 MB to hash it took 0.8 s a trial;
the listing takes 0.2 s.

The listing runs with the container's own ``find``, which the agent could have replaced too (a
replaced ``find`` is listed as changed only if it is honest). This is a flag for review
(``integrity_suspect``), not a guarantee.
"""

from __future__ import annotations

from rollgym.containers.runtime import Container
from rollgym.errors import SandboxError

WATCHED_TREES = (
    "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/lib/python3",
    "/usr/local/lib",
)  # fmt: skip
"""Trees listed whole: the shells and interpreters, Python's packages (pytest among them)."""
WATCHED_FILES = (
    "/etc/ld.so.preload", "/etc/profile", "/etc/bash.bashrc", "/etc/environment",
    "/root/.bashrc", "/root/.profile", "/root/.bash_profile",
)  # fmt: skip
WATCHED_NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth", "pytest.ini")
"""Found anywhere on the filesystem (but /proc, /sys, /dev, /tests, /logs)."""

_SCRIPT = r"""
{
  for t in {trees} /usr/lib/python3*; do
    [ -d "$t" ] && find "$t" -xdev \( -type f -o -type l \) -printf '%C@:%s:%m:%y  %p\n'
  done
  for f in {files}; do [ -e "$f" ] && find "$f" -maxdepth 0 -printf '%C@:%s:%m:%y  %p\n'; done
  find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tests -o -path /logs \) \
    -prune -o \( -type f -o -type l \) \( {names} \) -printf '%C@:%s:%m:%y  %p\n'
} 2>/dev/null | sort -u
true
"""


def manifest_script() -> str:
    names = " -o ".join(f"-name '{n}'" for n in WATCHED_NAMES)
    return (
        _SCRIPT.replace("{trees}", " ".join(WATCHED_TREES))
        .replace("{files}", " ".join(WATCHED_FILES))
        .replace("{names}", names)
    )


async def read_manifest(box: Container, *, timeout: float = 120.0) -> dict[str, str]:
    """``{path: "ctime:size:mode:type"}`` of the watched files in ``box``."""
    ran = await box.exec(["sh", "-c", manifest_script()], timeout=timeout, max_output=64 << 20)
    if ran.exit_code is None or ran.truncated:
        raise SandboxError("listing the verifier's tools did not finish (or printed too much)")
    out: dict[str, str] = {}
    for line in ran.stdout.splitlines():
        digest, sep, path = line.partition("  ")
        if sep:
            out[path] = digest
    return out


BIN_DIRS = ("/usr/bin/", "/usr/sbin/", "/usr/local/bin/", "/usr/local/sbin/")
TEST_PACKAGES = ("/pytest/", "/_pytest/", "/pluggy/", "/py.py")


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths changed (``~``) or removed (``-``) since ``before``, and added (``+``) where an
    addition is itself suspect: a startup file or ``conftest.py`` anywhere, a program in a
    ``bin`` directory (one in ``/usr/local/bin`` shadows ``/usr/bin``), a file in pytest's own
    packages. Other additions (a package the agent installed, bytecode Python wrote when the
    agent ran a test) are not counted. Sorted by path."""
    added = [f"+{p}" for p in after.keys() - before.keys() if _suspect_addition(p)]
    removed = [f"-{p}" for p in before.keys() - after.keys()]
    changed = [f"~{p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(added + removed + changed, key=lambda s: s[1:])


def _suspect_addition(path: str) -> bool:
    if path.endswith(".pyc"):
        return False
    name = path.rsplit("/", 1)[-1]
    if name in WATCHED_NAMES or name.endswith(".pth") or path in WATCHED_FILES:
        return True
    if path.startswith(BIN_DIRS) and "/" not in path.split("/bin/", 1)[-1]:
        return True
    return any(part in path for part in TEST_PACKAGES)
