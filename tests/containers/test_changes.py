"""Reading an overlay upper directory on the host (``containers.changes``), on a directory made
by hand as overlayfs makes one: whiteouts, an opaque directory, links, FIFOs, and what cannot be
rebuilt from it (a redirected directory) refused. Needs root (whiteouts are devices, the xattrs
``trusted.*``)."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from rollgym.containers.changes import read_upper
from rollgym.containers.runtime import TOO_LARGE
from rollgym.errors import ContainerError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted xattrs need root")

BOUNDS = {"max_bytes": 1 << 20, "max_entries": 1000}


def upper(tmp_path: Path) -> Path:
    root = tmp_path / "upper"
    (root / "app" / "sub").mkdir(parents=True)
    (root / "app" / "sub" / "a").write_text("a")
    os.symlink("../../../../etc/shadow", root / "app" / "up")
    os.mknod(root / "app" / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    (root / "etc" / "apt").mkdir(parents=True)
    os.setxattr(root / "etc" / "apt", "trusted.overlay.opaque", b"y")
    (root / "etc" / "apt" / "only").write_text("y")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3").write_text("#!/bin/sh\n")
    os.mkfifo(root / "app" / "pipe")
    (root / "etc" / "hosts").write_text("podman's")
    return root


def test_an_upper_directory_read_as_overlay_means_it(tmp_path: Path) -> None:
    found = read_upper(upper(tmp_path), drop=("/usr",), ignore=frozenset({"/etc/hosts"}), **BOUNDS)
    try:
        assert found.deleted == ("/app/gone",) and found.opaque == ("/etc/apt",)
        assert set(found.changed) == {"/app", "/app/sub", "/app/sub/a", "/app/up", "/etc",
                                      "/etc/apt", "/etc/apt/only"}  # fmt: skip
        assert set(found.dropped) == {"+/usr/bin/python3", "+/app/pipe"}
        with tarfile.open(found.archive) as tar:
            link = tar.getmember("app/up")
            assert link.issym() and link.linkname == "../../../../etc/shadow"
            assert "etc/hosts" not in tar.getnames() and "app/pipe" not in tar.getnames()
    finally:
        found.discard()


def test_past_the_bounds_nothing_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = upper(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # this test's archives only
    for bounds in ({"max_bytes": 1, "max_entries": 1000}, {"max_bytes": 1 << 20, "max_entries": 3}):
        with pytest.raises(ContainerError) as raised:
            read_upper(made, **bounds)
        assert raised.value.status == TOO_LARGE
    assert list(scratch.iterdir()) == []


def test_a_redirected_directory_is_refused_not_rebuilt_wrongly(tmp_path: Path) -> None:
    made = upper(tmp_path)
    os.setxattr(made / "app" / "sub", "trusted.overlay.redirect", b"/elsewhere")
    with pytest.raises(ContainerError, match="redirect"):
        read_upper(made, **BOUNDS)
