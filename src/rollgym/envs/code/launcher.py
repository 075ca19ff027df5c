"""The sandbox's launcher: run as a script by a fresh ``python -I`` (never imported by the
server, but for ``READY``), it isolates itself (``isolation.py``, ``confine.py``) and then
runs the untrusted program in its own process, as the tests' harness.

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
an honest solution returns (``asserts.py`` says why in full). Values cross as ``codec.py``
writes them.

Standard library only, as are the three modules it imports (and the packages' ``__init__``,
with ``rollgym/version.py``, which ``rollgym``'s own imports):
site-packages may hold anything, and is not visible anyway.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

if __name__ == "__main__":
    # ``python -I`` puts no directory on sys.path: the harness's modules are found from this
    # file, and imported now, before the sandbox's root hides them.
    sys.path.insert(0, os.path.abspath(os.path.join(__file__, *[os.pardir] * 4)))
from rollgym.envs.code import confine, isolation
from rollgym.envs.code.codec import ProbeSpec, decode, encode

if __name__ == "__main__":
    del sys.path[0]

READY = b"ready\n"


def _setup(spec: dict[str, Any], program: bytes) -> None:
    if spec["isolate"]:
        isolation.isolate(spec, program)
        confine.drop_privileges(spec["uid"])
    else:
        uid = spec["uid"] if spec["uid"] is not None and confine.reachable_by_others() else None
        isolation.write_program(os.getcwd(), program, uid)
        confine.confine_without_namespaces(uid)
    confine.apply_limits(spec["limits"])
    confine.seccomp(fallback=not spec["isolate"])


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
    """Call-based tests: stdin holds one JSON argument per line; the result goes to the server,
    which compares it."""
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
        confine.guard_without_namespaces()
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
