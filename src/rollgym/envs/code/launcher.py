"""The sandbox's launcher: run as a script by a fresh ``python -I`` (never imported by the
server, but for its constants and ``encode``), it isolates itself and then runs the untrusted
program in its own process.

Usage: ``launcher.py SPEC_JSON``. SPEC holds ``limits``, ``uid`` (or null), ``isolate``,
``work_dir`` (the fallback's host directory, or null), ``control_fd`` and ``mode`` (``stdio``,
``call`` or ``assert``), ``fn_name``. Standard input starts with one line giving a byte count
and that many bytes of JSON, ``{"program": ..., "probes": [...]}``; the rest is the test's input
and is left for the program. Nothing of the task but the program, its input and (assert tests)
the solution-side expressions ever enters the sandbox: expected outputs stay with the server.

Order matters: every step that needs privilege (mounts, the new root, dropping to ``uid`` or
dropping every capability) happens before the limits, and every limit before a single line of
the program runs. Once set up it writes ``ready`` and a newline to ``control_fd``, so the server
can tell a sandbox that could not start (no ``ready``: a failure of the environment) from a
program that failed (its own doing). Call and assert tests then write one line of JSON there:
the values the server judges. The program can write there too; it gains nothing by it, since
it never sees what the values are compared with.

Standard library only: site-packages may hold anything, and is not visible anyway.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any

WORK_DIR = "/tmp/work"
READY = b"ready\n"
MAX_DEPTH = 64
"""How deeply a judged value may nest; deeper is the program's error, not the server's."""

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_ST_FLAGS = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_LIB_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_HIDDEN = ("site-packages", "dist-packages")
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24


# -- the values judged by the server --------------------------------------------------------


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as tagged JSON: exact types only (a subclass of ``int`` with its own ``__eq__``
    is refused, not flattened), so the server compares plain values of its own."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value nests deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]  # str(): JSON integers lose precision in many readers
    if kind is float:
        return ["f", value]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind is complex:
        return ["c", [value.real, value.imag]]
    tags: dict[type, str] = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        return [tags[kind], [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"a {kind.__name__} cannot be judged: tests compare plain values")


# -- isolation (namespaces) -----------------------------------------------------------------


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


def _visible() -> tuple[list[str], list[str]]:
    """The host directories and files the sandbox sees (read-only): the system's library
    directories, the interpreter's standard library and binary, and any other file the
    interpreter has mapped. Nothing else: no checkout, venv, dataset or home directory."""
    dirs = [d for d in _LIB_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    dirs.append(os.path.realpath(os.path.dirname(os.__file__)))  # the standard library
    files = {os.path.realpath(sys.executable)}
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split(maxsplit=5)[-1].strip()
            if path.startswith("/") and os.path.isfile(path):
                files.add(os.path.realpath(path))
    covered = [f for f in files if not any(f.startswith(d + "/") for d in dirs)]
    return dirs, sorted(covered)


def _isolate(spec: dict[str, Any], program: bytes) -> None:
    """In this process's private mount namespace: a new root holding only what ``_visible``
    names (read-only), a fresh ``/proc``, a few devices, and a size- and inode-limited tmpfs at
    ``/tmp`` holding the work dir. The tmpfs lives in this namespace alone: it is gone with the
    run's last process, so there is nothing to clean up and nothing left on the host."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    limits = spec["limits"]
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    dirs, files = _visible()
    # Held open before the new root hides their paths (a checkout under /tmp, say).
    held = {path: os.open(path, os.O_PATH) for path in [*dirs, *files]}
    locked = {path: _locked_flags(path) for path in held}
    root = "/tmp"
    _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for link in ("/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"):
        if os.path.islink(link):
            os.symlink(os.readlink(link), root + link)
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
    _devices(libc, root)
    work_bytes, inodes = int(limits["work_bytes"]), int(limits["work_inodes"])
    os.mkdir(root + "/tmp")
    _mount(libc, "tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV,
           f"size={work_bytes},nr_inodes={inodes},mode=1777")  # fmt: skip
    os.mkdir(root + WORK_DIR)
    _write_program(root + WORK_DIR, program, spec["uid"])
    _mount(libc, None, root, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    os.chroot(root)
    os.chdir(WORK_DIR)


def _hide_site_packages(libc: Any, root: str, dirs: list[str]) -> None:
    """Installed packages are not the standard library: an empty read-only tmpfs over each."""
    for top in dirs:
        candidates = [os.path.join(top, name) for name in _HIDDEN]
        with os.scandir(top) as entries:
            for entry in entries:
                if entry.name.startswith("python") and entry.is_dir(follow_symlinks=False):
                    candidates += [os.path.join(entry.path, name) for name in _HIDDEN]
        for path in candidates:
            if os.path.isdir(path) and not os.path.islink(path):
                _mount(libc, "tmpfs", root + path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                       "size=4k,mode=0555")  # fmt: skip


def _devices(libc: Any, root: str) -> None:
    dev = root + "/dev"
    os.mkdir(dev)
    _mount(libc, "tmpfs", dev, "tmpfs", _MS_NOSUID, "size=64k,mode=0755")
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "w").close()
            _mount(libc, "/dev/" + name, f"{dev}/{name}", None, _MS_BIND, None)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("shm", "/tmp")):  # fmt: skip
        os.symlink(target, f"{dev}/{name}")
    _mount(libc, None, dev, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID, None)


def _write_program(workdir: str, program: bytes, uid: int | None) -> None:
    path = os.path.join(workdir, "solution.py")
    with open(path, "wb") as fh:
        fh.write(program)
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.chown(path, uid, uid)


def _drop_privileges(uid: int | None) -> None:
    """As root: become the slot's own uid (no capabilities left). In a user namespace (uid
    None): stay uid 0 there, but with every capability dropped, so no mount, ``chroot`` or
    ``unshare`` can undo the isolation. Either way no exec can regain privilege."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:
        for cap in range(64):
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # past the last capability: EINVAL
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capset: cannot drop the capabilities")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


# -- limits, and the fallback without namespaces --------------------------------------------


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


def _guard_without_namespaces() -> None:
    """Without namespaces: refuse, from Python code, sockets, new processes (a child would
    not inherit this hook) and ``ctypes`` (raw system calls). Weaker than namespaces (native
    code in an extension could still make the system calls), and said so in the README."""
    blocked = {"socket.__new__", "socket.bind", "socket.connect", "socket.sendto",
               "socket.gethostbyname", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
               "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
               "os.fork", "os.forkpty", "pty.spawn"}  # fmt: skip
    modules = {"_ctypes", "ctypes", "_posixsubprocess", "_socket", "socket", "_multiprocessing"}

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in blocked or (event == "import" and args and args[0] in modules):
            what = args[0] if event == "import" else event
            raise PermissionError(f"not allowed in this sandbox without namespaces ({what})")

    sys.addaudithook(hook)


def _setup(spec: dict[str, Any], program: bytes) -> None:
    if spec["isolate"]:
        _isolate(spec, program)
        _drop_privileges(spec["uid"])
    else:
        _write_program(os.getcwd(), program, None)
    _apply_limits(spec["limits"])


# -- the tests' harness ---------------------------------------------------------------------


def _read_exactly(n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(0, n - len(out))
        if not chunk:
            raise EOFError("standard input ended inside the sandbox's header")
        out += chunk
    return bytes(out)


def _read_header() -> dict[str, Any]:
    line = bytearray()
    while not line.endswith(b"\n"):
        if len(line) > 20:
            raise ValueError("no byte count at the start of standard input")
        line += _read_exactly(1)
    header: dict[str, Any] = json.loads(_read_exactly(int(line)))
    return header


def _report(fd: int, results: Any) -> None:
    data = json.dumps(results).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def _load(namespace: dict[str, Any]) -> None:
    with open("solution.py", encoding="utf-8", errors="surrogateescape") as fh:
        exec(compile(fh.read(), "solution.py", "exec"), namespace)


def _run_call(fd: int, fn_name: str) -> None:
    """NeMo Gym's call-based tests: stdin holds one JSON argument per line; the result goes
    to the server, which compares it."""
    args = [json.loads(line) for line in sys.stdin.read().split("\n") if line.strip()]
    namespace: dict[str, Any] = {"__name__": "__main__"}
    _load(namespace)
    fn = namespace.get(fn_name)
    if fn is None and "Solution" in namespace:
        fn = getattr(namespace["Solution"](), fn_name, None)
    if fn is None:
        raise SystemExit(f"the solution defines no function {fn_name!r}")
    result = fn(*args)
    _report(fd, list(result) if isinstance(result, tuple) else result)


def _run_probes(fd: int, probes: list[str]) -> None:
    """Assert tests: each probe (an expression over the solution's names) is evaluated here,
    after the solution ran; the comparison it was part of is made by the server."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    _load(namespace)
    results: list[Any] = []
    for probe in probes:
        try:
            results.append(["ok", encode(eval(probe, namespace))])
        except Exception as exc:  # the solution's error: reported, judged by the server
            results.append(["error", f"{type(exc).__name__}: {str(exc)[:200]}"])
    _report(fd, results)


def main() -> None:
    spec = json.loads(sys.argv[1])
    fd = spec["control_fd"]
    executable = os.path.realpath(sys.executable)  # a venv's link: not there once isolated
    try:
        header = _read_header()
        _setup(spec, header["program"].encode("utf-8", "surrogatepass"))
    except Exception as exc:  # the sandbox, not the program: say why on stderr, write no ready
        sys.stderr.write(f"rollgym-sandbox: setup failed: {type(exc).__name__}: {exc}\n")
        raise SystemExit(120) from None
    os.write(fd, READY)
    if not spec["isolate"]:
        _guard_without_namespaces()
    sys.argv = ["solution.py"]
    sys.path.insert(0, os.getcwd())
    sys.executable = executable
    if spec["mode"] == "call":
        _run_call(fd, spec["fn_name"])
    elif spec["mode"] == "assert":
        _run_probes(fd, header["probes"])
    else:
        import runpy

        os.close(fd)
        runpy.run_path("solution.py", run_name="__main__")


if __name__ == "__main__":
    main()
