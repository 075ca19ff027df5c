"""The sandbox's own root, in the run's private mount namespace: the launcher builds it before
the program's first line (``isolate``), from the interpreter, its standard library and the
shared libraries they load, read-only, a masked ``/proc``, a few devices and a size- and
inode-limited work dir that vanishes with the run.

Standard library only: the launcher imports this before the new root hides the rest.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WORK_DIR = "/tmp/work"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_ST_FLAGS = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
# Libraries the C library loads by name when it needs them (pthread_exit's unwinder), not
# named by any ELF file: looked for beside libc.
_DLOPENED = ("libgcc_s.so.1",)
_DEVICES = ("null", "zero", "full", "random", "urandom")
_HIDDEN = ("site-packages", "dist-packages")


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(
    libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    if libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _locked_flags(path: str) -> int:
    """The flags a read-only remount of a bind of ``path`` must keep: in a user namespace the
    kernel refuses to clear ``nosuid``/``nodev``/``noexec``/atime flags of the parent's mount."""
    have = os.statvfs(path).f_flag
    return sum(ms for st, ms in _ST_FLAGS.items() if have & st)


def interpreter_files() -> list[str]:
    """The files the interpreter and its standard library's extension modules load, named as
    the dynamic loader names them (symlinks and all): the loader itself and every shared
    library, from one ``ldd`` run over all of them. Empty without ``ldd`` (then only what the
    launcher has mapped is shown). The server finds this once and passes it in the spec."""
    import shutil
    import subprocess

    ldd = shutil.which("ldd", path="/usr/bin:/bin")
    if ldd is None:
        return []
    dynload = [p for p in sys.path if os.path.basename(p) == "lib-dynload" and os.path.isdir(p)]
    # Tk needs a display and its own script library: no test program can use it.
    modules = [os.path.join(d, name) for d in dynload for name in sorted(os.listdir(d))
               if name.endswith(".so") and not name.startswith("_tkinter")]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    done = subprocess.run([ldd, os.path.realpath(sys.executable), *modules], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    found: set[str] = set()
    for line in done.stdout.splitlines():
        # "\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)", "\t/lib64/ld-linux-....so.2 (0x...)"
        path = line.split("=>")[-1].split(" (0x")[0].strip()
        if line.startswith("\t") and path.startswith("/") and os.path.isfile(path):
            found.add(path)
    for path in list(found):
        if os.path.basename(path).startswith("libc.so"):
            found.update(p for name in _DLOPENED
                         if os.path.isfile(p := os.path.join(os.path.dirname(path), name)))  # fmt: skip
    return sorted(found)


def _visible(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The host paths the sandbox sees (read-only): the interpreter's standard library (the
    one directory), and as single files the interpreter, the dynamic loader and the shared
    libraries it and the standard extension modules load, and whatever else this process has
    mapped (its locale). Nothing else: no system library directory, checkout, venv, dataset
    or home directory."""
    dirs = [os.path.dirname(os.__file__)]
    given = spec.get("visible")
    files = set(interpreter_files() if given is None else given)
    files.add(os.path.realpath(sys.executable))
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split(maxsplit=5)[-1].strip()
            if path.startswith("/") and os.path.isfile(path):
                files.add(os.path.realpath(path))
    return dirs, sorted(files)


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """``path``'s real path. Every symlink met on the way goes into ``links`` (its path with
    its parent resolved, and its target), so the new root can hold the names the dynamic
    loader and ``sys.path`` use (``libffi.so.8``, ``/lib64``) beside the real files."""
    if depth > 40:
        raise OSError(f"too many symlinks resolving {path}")
    current = "/"
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            links[step] = os.readlink(step)
            current = _resolve(os.path.join(current, links[step]), links, depth + 1)
        else:
            current = step
    return current


def isolate(spec: dict[str, Any], program: bytes) -> None:
    """In this process's private mount namespace: a new root holding only what ``_visible``
    names (read-only), a fresh ``/proc`` with the host's entries masked, a few devices, and a
    size- and inode-limited tmpfs at ``/tmp`` holding the work dir. The tmpfs lives in this
    namespace alone: it is gone with the run's last process, so there is nothing to clean up
    and nothing left on the host. Nothing writable is executable (``noexec``): with
    ``memfd_create`` refused, ``execve`` can start only the read-only interpreter."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    limits = spec["limits"]
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    names, wanted = _visible(spec)
    links: dict[str, str] = {}
    dirs = sorted({_resolve(path, links) for path in names})
    inside = [f for f in {_resolve(path, links) for path in wanted} if os.path.isfile(f)]
    files = sorted(f for f in inside if not any(f.startswith(d + "/") for d in dirs))
    # Held open before the new root hides their paths (a checkout under /tmp, say).
    held = {path: os.open(path, os.O_PATH) for path in [*dirs, *files]}
    locked = {path: _locked_flags(path) for path in held}
    root = "/tmp"
    _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=1m,mode=0755")
    for link, target in sorted(links.items()):
        if not any(link.startswith(d + "/") for d in dirs):  # a bound directory holds its own
            os.makedirs(root + os.path.dirname(link), exist_ok=True)
            os.symlink(target, root + link)
    for path, fd in held.items():
        target = root + path
        if path in dirs:
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "w").close()
        _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND, None)
        ro = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | locked[path]
        _mount(libc, None, target, None, ro, None)
        os.close(fd)
    _hide_site_packages(libc, root, dirs)
    os.mkdir(root + "/proc")
    _mount(libc, "proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    _mask_proc(libc, root + "/proc")
    _devices(libc, root)
    work_bytes, inodes = int(limits["work_bytes"]), int(limits["work_inodes"])
    os.mkdir(root + "/tmp")
    _mount(libc, "tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
           f"size={work_bytes},nr_inodes={inodes},mode=1777")  # fmt: skip
    os.mkdir(root + WORK_DIR)
    write_program(root + WORK_DIR, program, spec["uid"])
    flags = _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _mount(libc, None, root, None, flags, None)
    os.chroot(root)
    os.chdir(WORK_DIR)


def _mask_proc(libc: Any, proc: str) -> None:
    """A fresh ``/proc`` lists only this PID namespace's processes, but its other entries are
    the host's (the kernel's command line, memory, boot id, devices, ``sys``): each is masked,
    a file by ``/dev/null`` and a directory by an empty read-only tmpfs, as container runtimes
    mask theirs. The program keeps ``/proc/self`` and its own processes' directories."""
    with os.scandir(proc) as entries:
        for entry in entries:
            if entry.name.isdigit() or entry.is_symlink():  # self, thread-self, net, mounts
                continue
            if entry.is_dir(follow_symlinks=False):
                _mount(libc, "tmpfs", entry.path, "tmpfs",
                       _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=4k,mode=0555")  # fmt: skip
            else:
                _mount(libc, "/dev/null", entry.path, None, _MS_BIND, None)


def _hide_site_packages(libc: Any, root: str, dirs: list[str]) -> None:
    """Installed packages are not the standard library: an empty read-only tmpfs over each.
    Looked for in the new root's copies (a host path under /tmp is hidden by now)."""
    for top in dirs:
        candidates = [root + os.path.join(top, name) for name in _HIDDEN]
        with os.scandir(root + top) as entries:
            for entry in entries:
                if entry.name.startswith("python") and entry.is_dir(follow_symlinks=False):
                    candidates += [os.path.join(entry.path, name) for name in _HIDDEN]
        for path in candidates:
            if os.path.isdir(path) and not os.path.islink(path):
                _mount(libc, "tmpfs", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                       "size=4k,mode=0555")  # fmt: skip


def _devices(libc: Any, root: str) -> None:
    dev = root + "/dev"
    os.mkdir(dev)
    _mount(libc, "tmpfs", dev, "tmpfs", _MS_NOSUID | _MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "w").close()
            _mount(libc, "/dev/" + name, f"{dev}/{name}", None, _MS_BIND, None)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("shm", "/tmp")):  # fmt: skip
        os.symlink(target, f"{dev}/{name}")
    _mount(libc, None, dev, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC, None)


def write_program(workdir: str, program: bytes, uid: int | None) -> None:
    path = os.path.join(workdir, "solution.py")
    with open(path, "wb") as fh:
        fh.write(program)
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.chown(path, uid, uid)
