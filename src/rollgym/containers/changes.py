"""A container's filesystem changes, read on the host from its overlay upper directory.

An overlay container's writes all land in one directory of the host (podman's
``GraphDriver.Data.UpperDir``). Reading it there, after every process of the container is gone,
tells what the container changed without running anything inside it: a program the container
replaced (its ``find``, ``tar``, ``sh``) cannot lie about it.

What the upper directory holds, and how it is read:
- a regular file, a symlink, a directory: added or changed (a symlink is archived as a link,
  never followed: a link to ``/etc/shadow`` or a chain of ``..`` reads nothing of the host);
- a character device 0/0 (a *whiteout*): the image's path of that name was deleted;
- a directory with the xattr ``trusted.overlay.opaque=y``: everything the image had below it is
  gone (it was removed and made again); only what the upper directory holds below it exists;
- ``trusted.overlay.redirect`` (a renamed directory) and ``trusted.overlay.metacopy`` (a file
  whose data is still the image's) cannot be rebuilt from the upper directory alone: refused,
  as a ``ContainerError``, never archived wrongly.

Other devices, sockets and FIFOs are not carried (listed in ``dropped``).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rollgym.containers.runtime import TOO_LARGE, ChangeSet
from rollgym.errors import ContainerError

OPAQUE = "trusted.overlay.opaque"
UNSUPPORTED_XATTRS = ("trusted.overlay.redirect", "trusted.overlay.metacopy")


@dataclass
class _Walk:
    drop: tuple[str, ...]
    ignore: frozenset[str]
    max_bytes: int
    max_entries: int
    tar: tarfile.TarFile
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    size: int = 0
    entries: int = 0

    def count(self, what: str) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise _too_large(f"more than {self.max_entries} changed paths ({what})")


def _too_large(detail: str) -> ContainerError:
    return ContainerError(
        f"the container's filesystem changes are too large to carry: {detail}",
        status=TOO_LARGE,
        endpoint="changes",
    )


def is_dropped(path: str, drop: tuple[str, ...]) -> bool:
    """Whether ``path`` is one of the ``drop`` patterns (``fnmatch``, ``*`` crossing ``/``) or
    below one."""
    return any(
        fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + "/*")
        for pattern in drop
    )


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise


def read_upper(
    upper: Path,
    *,
    drop: tuple[str, ...] = (),
    ignore: frozenset[str] = frozenset(),
    max_bytes: int,
    max_entries: int,
) -> ChangeSet:
    """The ``ChangeSet`` of the overlay upper directory ``upper`` (no link followed). Paths in
    ``ignore`` (the provider's own: ``/etc/hosts``, mount points) are skipped silently. Past
    ``max_bytes`` of content or ``max_entries`` paths: ``ContainerError`` (status
    ``TOO_LARGE``); the partial archive is removed."""
    fd, name = tempfile.mkstemp(prefix="rollgym-changes-", suffix=".tar")
    os.close(fd)
    archive = Path(name)
    try:
        with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
            walk = _Walk(drop, ignore, max_bytes, max_entries, tar)
            _walk_dir(walk, os.fsencode(upper), "", dropped_here=False)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    return ChangeSet(
        archive=archive,
        changed=tuple(walk.changed),
        deleted=tuple(walk.deleted),
        opaque=tuple(walk.opaque),
        dropped=tuple(walk.dropped),
        size=walk.size,
    )


MAX_DEPTH = 256
"""Directories deeper than this are past the bounds (the walk recurses once per level: a
review's 1,100 levels raised RecursionError on every verify)."""


def _walk_dir(walk: _Walk, host_dir: bytes, rel: str, *, dropped_here: bool) -> None:
    if rel.count("/") > MAX_DEPTH:
        raise _too_large(f"{rel[:200]}... is nested more than {MAX_DEPTH} directories deep")
    try:
        entries = sorted(os.scandir(host_dir), key=lambda e: e.name)
    except OSError as exc:
        raise ContainerError(
            f"cannot read the container's changes at {os.fsdecode(host_dir)}: {exc} "
            "(reading another user's overlay needs root)",
            endpoint="changes",
        ) from exc
    for entry in entries:
        path = f"{rel}/{os.fsdecode(entry.name)}"
        if path in walk.ignore:
            continue
        host = entry.path
        info = os.lstat(host)
        walk.count(path)
        dropped = dropped_here or is_dropped(path, walk.drop)
        mode = info.st_mode
        if stat.S_ISCHR(mode) and info.st_rdev == 0:
            (walk.dropped.append(f"-{path}") if dropped else walk.deleted.append(path))
            continue
        if stat.S_ISDIR(mode):
            host_s = os.fsdecode(host)
            for xattr in UNSUPPORTED_XATTRS:
                if _xattr(host_s, xattr) is not None:
                    raise ContainerError(
                        f"the container's change at {path} uses overlay's {xattr}: it cannot "
                        "be rebuilt from the upper directory",
                        endpoint="changes",
                    )
            is_opaque = _xattr(host_s, OPAQUE) == b"y"
            if dropped:
                if is_opaque:  # a directory only copied up to hold a change is no change
                    walk.dropped.append(f"!{path}")
            else:
                if is_opaque:
                    walk.opaque.append(path)
                _add(walk, host, path, info)
            _walk_dir(walk, host, path, dropped_here=dropped)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) or dropped:
            walk.dropped.append(f"+{path}")
            continue
        if stat.S_ISREG(mode):
            if _xattr(os.fsdecode(host), UNSUPPORTED_XATTRS[1]) is not None:
                raise ContainerError(
                    f"the container's change at {path} is an overlay metacopy (its data is "
                    "still the image's): it cannot be rebuilt from the upper directory",
                    endpoint="changes",
                )
            walk.size += info.st_size
            if walk.size > walk.max_bytes:
                raise _too_large(f"more than {walk.max_bytes} bytes ({path})")
        _add(walk, host, path, info)


def _add(walk: _Walk, host: bytes, path: str, info: os.stat_result) -> None:
    """``host`` into the archive as ``path`` (relative to ``/``), a link as a link."""
    member = walk.tar.gettarinfo(os.fsdecode(host), arcname=path.lstrip("/"))
    member.uname = member.gname = ""  # numeric ids: the image's names may differ from the host's
    walk.changed.append(path)
    if member.isreg():
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        with os.fdopen(os.open(host, flags), "rb") as data:
            walk.tar.addfile(member, data)
    else:
        walk.tar.addfile(member)
