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
    """``value`` as tagged JSON of plain values. A subclass is read through its base type's
    own methods (a ``Counter`` as a ``dict``, a namedtuple as a ``tuple``, an ``int`` with a
    rigged ``__eq__`` as its digits), iterators and views as the items they give; so the
    server compares plain values of its own, and no method of the program's runs there."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value nests deeper than {MAX_DEPTH} levels")
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", value]  # bool has no subclasses
    if isinstance(value, int):
        return ["i", int.__repr__(value)]  # digits: JSON integers lose precision in readers
    if isinstance(value, float):
        return ["f", float.__float__(value)]
    if isinstance(value, str):
        return ["s", str.__str__(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["y", bytes.hex(bytes(value))]
    if isinstance(value, complex):
        plain = complex(value)
        return ["c", [float.__float__(plain.real), float.__float__(plain.imag)]]
    bases: tuple[tuple[Any, str], ...] = ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F"))
    for base, tag in bases:
        if isinstance(value, base):
            return [tag, [encode(v, depth + 1) for v in base.__iter__(value)]]
    if isinstance(value, dict):
        items = dict.items(value)
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items]]
    given: Any = value
    if isinstance(value, (type({}.keys()), type({}.items()))):
        return ["S", [encode(item, depth + 1) for item in given]]  # views compare as sets do
    if hasattr(type(value), "__next__") or isinstance(value, (range, type({}.values()))):
        return ["it", [encode(item, depth + 1) for item in given]]
    raise TypeError(f"a {type(value).__name__} cannot be judged: tests compare plain values")


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


# System calls by name: (x86_64, aarch64) numbers; None where the architecture has none.
_SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "socket": (41, 198), "ptrace": (101, 117), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "kill": (62, 129), "tkill": (200, 130),
    "tgkill": (234, 131), "fork": (57, None), "vfork": (58, None), "clone": (56, 220),
    "clone3": (435, 435), "pidfd_open": (434, 434), "pidfd_send_signal": (424, 424),
    "pidfd_getfd": (438, 438), "unshare": (272, 97), "setns": (308, 268), "bpf": (321, 280),
    "perf_event_open": (298, 241), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
}  # fmt: skip
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}
# Kernel interfaces no test program needs, each a known way out of or around a sandbox.
_NEVER = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "unshare", "setns",
          "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
          "chroot")  # fmt: skip
# Without namespaces, also: no sockets, no new processes (threads only), no signal to any
# process but this one, since the program runs as the server's own user.
_FALLBACK = ("socket", "fork", "vfork", "tkill", "pidfd_open", "pidfd_send_signal")
_EPERM, _ENOSYS, _CLONE_THREAD = 1, 38, 0x10000


def _seccomp_filter(fallback: bool) -> bytes | None:
    """The seccomp program (classic BPF) for this architecture, or None if unknown here."""
    import struct

    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    column, audit_arch = arch
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, deny = 0x7FFF0000, 0x80000000, 0x00050000 | _EPERM
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if column == 0:  # x86_64: the x32 ABI's numbers would slip past every rule below
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, deny)]
    numbers: dict[str, int] = {}
    for syscall, pair in _SYSCALLS.items():
        number = pair[column]
        if number is not None:
            numbers[syscall] = number
    for name in (*_NEVER, *(_FALLBACK if fallback else ())):
        if name in numbers:
            prog += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, deny)]
    if fallback:
        # clone3's flags sit behind a pointer a filter cannot read: ENOSYS, and the C
        # library falls back to clone, whose flags can be read: threads only.
        prog += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, 0x00050000 | _ENOSYS)]
        prog += [(jeq, 0, 4, numbers["clone"]), (ld, 0, 0, 16), (jset, 0, 1, _CLONE_THREAD),
                 (ret, 0, 0, allow), (ret, 0, 0, deny)]  # fmt: skip
        for name in ("kill", "tgkill"):  # only to this very process (pid in the low word)
            prog += [(jeq, 0, 6, numbers[name]), (ld, 0, 0, 20), (jeq, 0, 3, 0), (ld, 0, 0, 16),
                     (jeq, 0, 1, os.getpid()), (ret, 0, 0, allow), (ret, 0, 0, deny)]  # fmt: skip
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def _seccomp(fallback: bool) -> None:
    """Install the filter (inherited by every child, and never removable). Without a known
    architecture there is none: the README says so."""
    import ctypes

    program = _seccomp_filter(fallback)
    if program is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    prog = Prog(len(program) // 8, program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _setup(spec: dict[str, Any], program: bytes) -> None:
    if spec["isolate"]:
        _isolate(spec, program)
        _drop_privileges(spec["uid"])
    else:
        _write_program(os.getcwd(), program, None)
    _apply_limits(spec["limits"])
    _seccomp(fallback=not spec["isolate"])


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
