"""What confines the program besides its root: privileges dropped, rlimits, the kernel's
system-call filter (seccomp), and without namespaces a Landlock domain and an audit hook.

Every step here happens in the launcher before the program's first line, and none can be
undone by it: no capability is left to undo them, and a seccomp filter is never removed.

Standard library only: the launcher imports this before the sandbox's root hides the rest.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24


def drop_privileges(uid: int | None) -> None:
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


def _limit(name: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(name, (soft, soft if hard is None else hard))


def apply_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_seconds"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at the soft limit, SIGKILL 1 s later
    _limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _limit(resource.RLIMIT_NPROC, int(limits["processes"]))
    _limit(resource.RLIMIT_CORE, 0)


def guard_without_namespaces() -> None:
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
    "personality": (135, 92), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "kcmp": (312, 272),
}  # fmt: skip
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}
# Kernel interfaces no test program needs, each a known way out of or around a sandbox:
# memfd_create and execveat run a binary that is on no mount (every writable mount is
# noexec), personality turns address randomisation off for what is exec'd next, kcmp tells
# whether another process shares a file or memory with this one.
_NEVER = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "unshare",
          "setns", "bpf", "perf_event_open", "io_uring_setup", "io_uring_enter",
          "io_uring_register", "userfaultfd", "keyctl", "add_key", "request_key", "mount",
          "umount2", "pivot_root", "chroot", "memfd_create", "execveat", "personality")  # fmt: skip
# Without namespaces, also: no sockets, no new processes (threads only) and no exec (the host's
# binaries are all there), no signal to any process but this one: tkill (a bare thread id) and
# pidfds refused, and every call that names a process (_SIGNALS) only for this very one.
_FALLBACK = ("socket", "fork", "vfork", "execve", "tkill", "pidfd_open", "pidfd_send_signal")
_SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # the pid: argument 0
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
        for name in _SIGNALS:  # only to this very process (its pid in the low word)
            prog += [(jeq, 0, 6, numbers[name]), (ld, 0, 0, 20), (jeq, 0, 3, 0), (ld, 0, 0, 16),
                     (jeq, 0, 1, os.getpid()), (ret, 0, 0, allow), (ret, 0, 0, deny)]  # fmt: skip
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def seccomp(fallback: bool) -> None:
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


def confine_without_namespaces(uid: int | None) -> None:
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
    drop_privileges(uid)
    if not _landlock() and uid is None:
        raise OSError(
            "without namespaces the program could read other processes' environments: run "
            "as root (each run gets its own uid) or on a kernel with Landlock (Linux 5.13+)"
        )


def reachable_by_others() -> bool:
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
