"""The verifier's own tools, hashed: what an agent would change to forge a test's result.

A test script trusts its shell, Python, pytest and whatever Python loads at start
(``sitecustomize.py``, ``usercustomize.py``, ``.pth`` files, every ``conftest.py`` on a test's
path). An agent that rewrites one of them can make any test pass. ``read_manifest`` hashes them
inside a container; ``changed_paths`` names what differs from the prepared image.

The hashing runs with the container's own ``find`` and ``sha256sum``, which the agent could have
replaced too: a replaced ``sha256sum`` lists itself as changed only if it is honest. This is a
flag for review (``integrity_suspect``), not a guarantee.
"""

from __future__ import annotations

from rollgym.containers.runtime import Container
from rollgym.errors import SandboxError

WATCHED_TREES = (
    "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/usr/lib/python3",
    "/usr/local/lib",
)  # fmt: skip
"""Trees hashed whole: the shells and interpreters, Python's packages (pytest among them)."""
WATCHED_FILES = (
    "/etc/ld.so.preload", "/etc/profile", "/etc/bash.bashrc", "/etc/environment",
    "/root/.bashrc", "/root/.profile", "/root/.bash_profile",
)  # fmt: skip
WATCHED_NAMES = ("conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth", "pytest.ini")
"""Found anywhere on the filesystem (but /proc, /sys, /dev, /tests, /logs)."""

_SCRIPT = r"""
set -u
{
  for t in {trees} /usr/lib/python3*; do [ -d "$t" ] && find "$t" -xdev -type f; done
  for f in {files}; do [ -f "$f" ] && echo "$f"; done
  find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tests -o -path /logs \) \
    -prune -o -type f \( {names} \) -print
} 2>/dev/null | sort -u | while IFS= read -r f; do
  sha256sum "$f" 2>/dev/null || echo "unreadable  $f"
done
"""


def manifest_script() -> str:
    names = " -o ".join(f"-name '{n}'" for n in WATCHED_NAMES)
    return (
        _SCRIPT.replace("{trees}", " ".join(WATCHED_TREES))
        .replace("{files}", " ".join(WATCHED_FILES))
        .replace("{names}", names)
    )


async def read_manifest(box: Container, *, timeout: float = 120.0) -> dict[str, str]:
    """``{path: sha256}`` of the watched files in ``box``."""
    ran = await box.exec(["sh", "-c", manifest_script()], timeout=timeout, max_output=64 << 20)
    if ran.exit_code is None or ran.truncated:
        raise SandboxError("hashing the verifier's tools did not finish (or printed too much)")
    out: dict[str, str] = {}
    for line in ran.stdout.splitlines():
        digest, sep, path = line.partition("  ")
        if sep:
            out[path] = digest
    return out


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths added, removed or changed, each marked ``+``, ``-`` or ``~``, sorted. A new
    ``.pyc`` is not counted: Python writes them itself when the agent runs a test."""
    added = [f"+{p}" for p in after.keys() - before.keys() if not p.endswith(".pyc")]
    removed = [f"-{p}" for p in before.keys() - after.keys()]
    changed = [f"~{p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(added + removed + changed, key=lambda s: s[1:])
