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
the values the server judges. The program can write there too, and nothing in this process
could stop it (it runs in the same interpreter: any fd, key or frame here is its to read); a
report holds only what the program's own calls return, on arguments the server computed and
this launcher decoded before the program's first line, so a forged line claims no more than
an honest solution returns (``asserts.py`` says why in full).

Standard library only: site-packages may hold anything, and is not visible anyway.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from typing import Any, TypedDict

WORK_DIR = "/tmp/work"
READY = b"ready\n"
MAX_DEPTH = 64
"""How deeply a judged value may nest; deeper is the program's error, not the server's."""

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_ST_FLAGS = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
# Libraries the C library loads by name when it needs them (pthread_exit's unwinder), not
# named by any ELF file: looked for beside libc.
_DLOPENED = ("libgcc_s.so.1",)
_DEVICES = ("null", "zero", "full", "random", "urandom")
_HIDDEN = ("site-packages", "dist-packages")
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24


# -- the values judged by the server --------------------------------------------------------


class ProbeSpec(TypedDict):
    """One solution-dependent expression of an assert test, and its arguments: the values
    of the names ``__rollgym_arg_N`` in ``expr``, as ``encode`` wrote them (server-computed)."""

    expr: str
    args: dict[str, Any]


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


def decode(node: Any) -> Any:
    """``encode``'s inverse, for the server's own values (a probe's arguments)."""
    tag, rest = node[0], node[1:]
    if tag == "n":
        return None
    (payload,) = rest
    if tag in ("b", "f", "s"):
        return payload
    if tag == "i":
        return int(payload)
    if tag == "y":
        return bytes.fromhex(payload)
    if tag == "c":
        return complex(payload[0], payload[1])
    if tag == "d":
        return {decode(k): decode(v) for k, v in payload}
    items = [decode(v) for v in payload]
    kinds: dict[str, Any] = {"l": list, "t": tuple, "S": set, "F": frozenset, "it": iter}
    return kinds[tag](items)


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


def _isolate(spec: dict[str, Any], program: bytes) -> None:
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
    _write_program(root + WORK_DIR, program, spec["uid"])
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
    "memfd_create": (319, 279), "execve": (59, 221), "execveat": (322, 281),
    "personality": (135, 92),
}  # fmt: skip
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}
# Kernel interfaces no test program needs, each a known way out of or around a sandbox:
# memfd_create and execveat run a binary that is on no mount (every writable mount is
# noexec), personality turns address randomisation off for what is exec'd next.
_NEVER = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "unshare", "setns",
          "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "userfaultfd", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
          "chroot", "memfd_create", "execveat", "personality")  # fmt: skip
# Without namespaces, also: no sockets, no new processes (threads only) and no exec (the host's
# binaries are all there), no signal to any process but this one.
_FALLBACK = ("socket", "fork", "vfork", "execve", "tkill", "pidfd_open", "pidfd_send_signal")
# Socket families that reach past a network namespace: vsock (the hypervisor's host) and
# netlink (the kernel's interfaces, some of them host-wide). Refused in every mode.
_AF_NETLINK, _AF_VSOCK = 16, 40
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
    # socket(family, ...): the family is the low word of the first argument, as the kernel
    # reads it (an int).
    prog += [(jeq, 0, 5, numbers["socket"]), (ld, 0, 0, 16), (jeq, 2, 0, _AF_NETLINK),
             (jeq, 1, 0, _AF_VSOCK), (ret, 0, 0, allow), (ret, 0, 0, deny)]  # fmt: skip
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


def _confine_without_namespaces(uid: int | None) -> None:
    """Without namespaces every process of the host is in sight, and ``/proc/PID/environ`` of
    each holds the environment it started with: the server's, or the model server's API key.
    The kernel shows it to a process that passes a ptrace check on its owner, so the program
    must pass that check for no process outside the sandbox. As root it becomes the slot's
    own uid where that uid can reach the interpreter (no other process runs as it), and
    otherwise keeps uid 0 without a single capability (``CAP_SYS_PTRACE`` would pass the
    check). Either way it then enters a Landlock domain (Linux 5.13+), and the kernel refuses
    such access (``environ``, ``mem``, ``fd``) to every process outside it, whatever the uid.
    With neither a uid of its own nor Landlock the run is refused: a parent with an empty
    environment would not do, as the program can find the server, and every other process of
    its user, in ``/proc``."""
    _drop_privileges(uid)
    if not _landlock() and uid is None:
        raise OSError(
            "without namespaces the program could read other processes' environments: run "
            "as root (each run gets its own uid) or on a kernel with Landlock (Linux 5.13+)"
        )


def _reachable_by_others() -> bool:
    """Whether a uid of its own, in no group, can run this interpreter: the executable, its
    standard library and every directory on the way to them open to others (not under a
    private home such as ``/root``)."""
    import stat

    for path in (os.path.realpath(sys.executable), os.path.realpath(os.path.dirname(os.__file__))):
        while True:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
            if path == "/":
                break
            path = os.path.dirname(path)
    return True


_LANDLOCK_CREATE_RULESET, _LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every architecture
_LANDLOCK_MAKE_DEVICES = (1 << 6) | (1 << 11)  # LANDLOCK_ACCESS_FS_MAKE_CHAR, _MAKE_BLOCK


def _landlock() -> bool:
    """Enter a Landlock domain; False if the kernel has none. The ruleset refuses only what no
    program needs (making device nodes): the domain itself is the point, as Landlock lets a
    process in one ptrace-access (read ``/proc/PID/environ`` of) only processes inside it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    handled = ctypes.c_uint64(_LANDLOCK_MAKE_DEVICES)
    size = ctypes.c_size_t(ctypes.sizeof(handled))
    fd = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(handled), size, ctypes.c_uint32(0))
    if fd < 0:
        return False  # ENOSYS or EOPNOTSUPP: no Landlock in this kernel
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_LANDLOCK_RESTRICT_SELF, fd, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)
    return True


def _setup(spec: dict[str, Any], program: bytes) -> None:
    if spec["isolate"]:
        _isolate(spec, program)
        _drop_privileges(spec["uid"])
    else:
        uid = spec["uid"] if spec["uid"] is not None and _reachable_by_others() else None
        _write_program(os.getcwd(), program, uid)
        _confine_without_namespaces(uid)
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


def _run_probes(fd: int, probes: list[ProbeSpec]) -> None:
    """Assert tests: each probe (a call of the solution's, say) is evaluated here, after the
    solution ran; everything around it, and its arguments, the server computed. The probes
    are compiled and their arguments decoded before the solution's first line, so nothing it
    does on import changes what is asked (only what its own functions answer)."""
    asked = [(compile(p["expr"], "<assert>", "eval"), {k: decode(v) for k, v in p["args"].items()})
             for p in probes]  # fmt: skip
    evaluate = eval
    namespace: dict[str, Any] = {"__name__": "__main__"}
    _load(namespace)
    results: list[Any] = []
    for code, args in asked:
        try:  # the arguments' names beside the solution's, never in its own globals
            results.append(["ok", encode(evaluate(code, {**namespace, **args}))])
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
