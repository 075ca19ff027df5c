"""The sandbox's launcher: run as a script by a fresh ``python -I`` (never imported by the
server), it isolates itself and then runs the untrusted program in its own process.

Usage: ``launcher.py SPEC_JSON`` with the working directory as cwd and the test's input on
stdin. SPEC holds ``limits``, ``uid`` (or null), ``isolate_fs``, ``block_net``, ``ready_fd``,
``mode`` (``stdio``, ``call`` or ``assert``), ``program`` (a file in the cwd), ``fn_name``.

Order matters: every step that needs privilege (mounts, dropping to ``uid``) happens before the
limits, and every limit before a single line of the program runs. Once set up it writes
``ready`` to ``ready_fd`` and closes it, so the server can tell a sandbox that could not start
(no ``ready``: a failure of the environment) from a program that failed (its own doing).
Standard library only: site-packages may hold anything.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from typing import Any

RESULT_MARKER = "\x00rollgym-result:"
WORK_DIR = "/tmp/work"
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 32, 4096
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
_SKIP_REMOUNT = ("/proc", "/sys", "/dev")


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(
    libc: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    if libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _isolate_fs(workdir: str, spec_paths: list[str]) -> None:
    """In this process's private mount namespace: every mount read-only but the work dir,
    and fresh small tmpfs on the world-writable scratch dirs, so nothing outside the work dir
    can be written and nothing written outside it survives the run."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/self/mounts") as fh:
        targets = [line.split()[1].replace("\\040", " ") for line in fh]
    _mount(libc, workdir, workdir, None, _MS_BIND, None)
    keep = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    for target in targets:
        if target == workdir or target.startswith(_SKIP_REMOUNT):
            continue
        try:
            _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
        except OSError:
            if target == "/":
                raise
    # The interpreter or this launcher may live under a scratch dir (a checkout in /tmp): keep
    # that part of it, read-only, through the fresh tmpfs about to hide it.
    kept = {}
    for path in spec_paths:
        top = _scratch_top(os.path.abspath(path))
        if top is not None and top not in kept:
            kept[top] = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for target in _SCRATCH:
        if os.path.isdir(target):
            _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=16m,mode=1777")
    for top, fd in kept.items():
        os.makedirs(top, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", top, None, _MS_BIND, None)
        _mount(libc, None, top, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
        os.close(fd)
    for path in spec_paths:
        _expose(libc, path)
    # The work dir's own path now lies under the fresh /tmp: show it there as WORK_DIR.
    os.mkdir(WORK_DIR)
    _mount(libc, f"/proc/self/fd/{keep}", WORK_DIR, None, _MS_BIND, None)
    os.close(keep)
    os.chdir(WORK_DIR)
    os.environ["HOME"] = os.environ["TMPDIR"] = WORK_DIR


def _scratch_top(path: str) -> str | None:
    """The first directory of ``path`` below a scratch dir (``/tmp/ci`` for
    ``/tmp/ci/.venv/bin``), or None if ``path`` is not under one."""
    for scratch in _SCRATCH:
        if path.startswith(scratch + "/"):
            return os.path.join(scratch, path[len(scratch) + 1 :].split("/")[0])
    return None


def _expose(libc: Any, path: str) -> None:
    """Let the sandbox's uid reach ``path`` (the interpreter, the launcher) when an ancestor
    is private to the server's user (e.g. ``/root/.pyenv/...`` under a 0700 ``/root``): a
    tmpfs over that ancestor, holding only the way to ``path`` (it hides the rest, too)."""
    parts = os.path.abspath(path).strip("/").split("/")
    for depth in range(len(parts)):
        ancestor = "/" + "/".join(parts[:depth])
        if os.stat(ancestor).st_mode & 0o001:
            continue
        child = parts[depth]
        keep = os.open(os.path.join(ancestor, child), os.O_RDONLY | os.O_DIRECTORY)
        _mount(libc, "tmpfs", ancestor, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
        os.mkdir(os.path.join(ancestor, child))
        _mount(libc, f"/proc/self/fd/{keep}", os.path.join(ancestor, child), None, _MS_BIND, None)
        os.close(keep)


def _limit(name: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(name, (soft, soft if hard is None else hard))


def _apply_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_seconds"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at the soft limit, SIGKILL 1 s later
    _limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _limit(resource.RLIMIT_NPROC, int(limits["processes"]))
    _limit(resource.RLIMIT_CORE, 0)


def _block_sockets() -> None:
    """Without a network namespace: refuse socket use from Python code. Weaker (native code
    can still make the system call), and said so in the README."""
    blocked = {"socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.gethostbyname",
               "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym"}  # fmt: skip

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in blocked:
            raise PermissionError(f"network access is not allowed in the sandbox ({event})")

    sys.addaudithook(hook)


def _setup(spec: dict[str, Any]) -> None:
    if spec["isolate_fs"]:
        _isolate_fs(os.getcwd(), [sys.base_prefix, sys.prefix, os.path.dirname(__file__)])
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _apply_limits(spec["limits"])


def _run_call(program: str, fn_name: str) -> None:
    """NeMo Gym's call-based tests: stdin holds one JSON argument per line; print the result."""
    args = [json.loads(line) for line in sys.stdin.read().split("\n") if line.strip()]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with open(program) as fh:
        exec(compile(fh.read(), program, "exec"), namespace)
    fn = namespace.get(fn_name)
    if fn is None and "Solution" in namespace:
        fn = getattr(namespace["Solution"](), fn_name, None)
    if fn is None:
        raise SystemExit(f"the solution defines no function {fn_name!r}")
    result = fn(*args)
    if isinstance(result, tuple):
        result = list(result)
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    ready = spec["ready_fd"]
    try:
        _setup(spec)
    except Exception as exc:  # the sandbox, not the program: say why on stderr, write no ready
        sys.stderr.write(f"rollgym-sandbox: setup failed: {type(exc).__name__}: {exc}\n")
        raise SystemExit(120) from None
    os.write(ready, b"ready\n")
    os.close(ready)
    if spec["block_net"]:
        _block_sockets()
    program = spec["program"]
    sys.argv = [program]
    sys.path.insert(0, os.getcwd())
    if spec["mode"] == "call":
        _run_call(program, spec["fn_name"])
        return
    import runpy

    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
