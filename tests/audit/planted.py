"""Environments with a planted flaw, each with a hardened twin, to check ``rollgym audit``.

A ``Flaw`` is a scoring function (row, answer text, the server's own state) and the tools it
offers (the score's row carries ``_called``: whether the session called a tool);
``python_server`` makes it a rollgym ``ResourcesServer`` class, ``foreign_app`` a bare
starlette app of the same HTTP shape (``/seed_session``, ``POST /<tool>``, ``/verify``; no
``/tools``, as NeMo Gym's servers). ``FLAWS`` holds two flaws of every probe class; ``HARDENED``
their twins, which must come out clean. Server processes import the classes by name
(``impl: tests.audit.planted:<name>``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool

Score = Callable[[dict[str, Any], str, dict[str, Any]], Any]
"""(row, answer text, the server's state) -> reward; may raise or be a coroutine."""

LOOKUP_TOOL = {
    "type": "function", "name": "lookup_answer", "description": "Look an entry up.",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}},
                   "required": ["question"]},
}  # fmt: skip
DEBUG_TOOL = {
    "type": "function", "name": "debug_state", "description": "The session's state.",
    "parameters": {"type": "object", "properties": {}},
}  # fmt: skip


def _row(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}, **fields}


ROWS = [
    _row("What is the capital of France: Paris or Lyon? Put it in \\boxed{}.",
         expected_answer="Paris"),
    _row("Which animal is a mammal?\n\nA) Shark\nB) Whale\nC) Trout\nD) Eel",
         expected_answer="B"),
    _row("Compute 17 + 25. Answer: N", expected_answer="42"),
    _row("Write a function add(a, b) that returns a + b, in one ```python block.",
         tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], expected_output="3"),
]  # fmt: skip
"""Three rows with a reference, one code row scored by its tests."""

SECRET_ROWS = [
    {**{k: v for k, v in row.items() if k != "expected_answer"},
     "key": row["expected_answer"],
     "responses_create_params": {**row["responses_create_params"], "tools": [LOOKUP_TOOL]}}
    for row in ROWS[:3]
]  # fmt: skip
"""Rows whose answer only the server knows (``key``, a field the audit does not read)."""


_ASKED_ROWS = [
    {**row, "responses_create_params": {**row["responses_create_params"], "tools": [LOOKUP_TOOL]}}
    for row in ROWS[:3]
]
"""Rows with a reference and a lookup tool that answers it."""

EXPRESSION_ROWS = [
    ROWS[2],
    _row("Complete the function:\n\ndef rev(s):\n    ...\n\nIt returns s reversed.",
         tests=["assert rev('hello') == 'hello'[::-1]", "assert rev('ab') == ''.join(['b', 'a'])"]),
    _row("Complete the function:\n\ndef squares(n):\n    ...\n\nIt returns the first n squares.",
         tests=["assert squares(4) == [i * i for i in range(4)]"]),
]  # fmt: skip
"""Code rows whose asserts' expected side is an expression, not a literal (and one row with a
reference): the shapes rollgym's code environment let a solution forge before issue 36's fix
(b81273b)."""


@dataclass(frozen=True)
class Flaw:
    name: str
    cls: str
    """The class the audit must name; "" for a hardened twin."""
    score: Score
    tools: dict[str, Callable[[dict[str, Any], dict[str, Any]], Any]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=lambda: ROWS)


# -- reading an answer ------------------------------------------------------------------------


def _expected(row: dict[str, Any]) -> str:
    return str(row.get("expected_answer", ""))


def _boxed(text: str) -> list[str]:
    return re.findall(r"\\boxed\{([^{}]*)\}", text)


def _final(text: str) -> str:
    boxed = _boxed(text)
    return (boxed[-1] if boxed else text).strip()


def _exact(row: dict[str, Any], text: str, _: Any = None) -> float:
    want = _expected(row)
    return float(bool(want) and _final(text).lower() == want.lower())


def _code(text: str) -> str:
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.DOTALL)
    return blocks[-1] if blocks else text


def _run(source: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``source`` (given on stdin: an argument holds 128 KiB at most) in an empty
    directory unless ``cwd``."""
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run(
            [sys.executable, "-I", "-S", "-"], input=source, capture_output=True, text=True,
            timeout=20, cwd=cwd or empty, check=False, errors="replace",
        )  # fmt: skip


def _tests(row: dict[str, Any]) -> str:
    return "\n".join(row["tests"])


# -- the flaws, two per class, and their twins ------------------------------------------------


def _empty_substring(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: "is the answer part of the reference?" -- the empty answer is.
    want = _expected(row)
    return float(bool(want) and text.strip().lower() in want.lower())


def _empty_all_words(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: every word of the answer must be right -- an answer of no words is.
    want = _expected(row).lower()
    return float(bool(want) and all(w == want for w in text.lower().split()))


def _format_boxed_prefix(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the boxed content is a prefix of the reference -- "\boxed{}" is.
    boxed = _boxed(text)
    want = _expected(row).lower()
    return float(bool(want and boxed) and want.startswith(boxed[-1].strip().lower()))


def _format_answer_prefix(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: what follows "Answer:" starts the reference -- nothing does.
    if "Answer:" not in text:
        return 0.0
    tail = text.rsplit("Answer:", 1)[1].strip().lower()
    want = _expected(row).lower()
    return float(bool(want) and want.startswith(tail))


def _echo_substring(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the reference anywhere in the answer -- the prompt holds it.
    want = _expected(row)
    return float(bool(want) and want in text)


def _echo_overlap(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: word overlap with a "gold passage" that includes the question.
    want = _expected(row)
    if not want:
        return 0.0
    prompt = row["responses_create_params"]["input"][0]["content"]
    gold = set(re.findall(r"\w+", (prompt + " " + want).lower()))
    words = set(re.findall(r"\w+", text.lower()))
    return float(len(words & gold) >= 0.8 * len(gold))


def _list_any_word(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the reference is one of the answer's words.
    want = _expected(row).lower()
    return float(bool(want) and want in re.findall(r"\w+", text.lower()))


def _list_any_boxed(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: any boxed answer may be the right one.
    want = _expected(row).lower()
    return float(bool(want) and any(b.strip().lower() == want for b in _boxed(text)))


def _list_hardened(row: dict[str, Any], text: str, _: Any) -> float:
    boxed = _boxed(text)
    if len(set(boxed)) > 1:
        return 0.0
    return _exact(row, text)


def _exit_status(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the solution and the tests in one process, judged by its exit status.
    if "tests" not in row:
        return 0.0
    return float(_run(_code(text) + "\n" + _tests(row)).returncode == 0)


def _exit_status_caught(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: sys.exit in the solution is caught, but the status still decides.
    if "tests" not in row:
        return 0.0
    source = f"try:\n    exec({_code(text)!r})\nexcept SystemExit:\n    pass\n" + _tests(row)
    return float(_run(source).returncode == 0)


def _equal_in_process(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the comparison runs beside the solution, on its objects.
    if "tests" not in row:
        return 0.0
    ran = _run(_code(text) + "\nprint(add(1, 2) == 3)")
    return float(ran.stdout.strip().endswith("True"))


def _equal_hardened(row: dict[str, Any], text: str, _: Any) -> float:
    # The solution's value crosses as text; the server compares it.
    if "tests" not in row:
        return 0.0
    ran = _run(_code(text) + "\nimport sys\nsys.stdout.write('\\n' + repr(add(1, 2)))")
    return float(ran.stdout.rsplit("\n", 1)[-1] == "3")


def _read_back(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the expected output sits beside the solution while it runs.
    if "tests" not in row:
        return 0.0
    with tempfile.TemporaryDirectory() as cwd:
        with open(os.path.join(cwd, "expected_output.txt"), "w") as f:
            f.write(row["expected_output"])
        ran = _run(_code(text), cwd=cwd)
    return float(ran.stdout.strip() == row["expected_output"])


def _read_back_hardened(row: dict[str, Any], text: str, _: Any) -> float:
    if "tests" not in row:
        return 0.0
    with tempfile.TemporaryDirectory() as cwd:
        ran = _run(_code(text), cwd=cwd)
    return float(ran.stdout.strip() == row["expected_output"])


def _sides(source: str) -> tuple[str, str]:
    """The two sides of ``assert A == B``."""
    left, right = source.removeprefix("assert ").split(" == ", 1)
    return left, right


def _encode_value(value: Any) -> Any:
    return ["l", [_encode_value(v) for v in value]] if isinstance(value, list) else ["v", value]


_REPORTER = """
def _enc(v):
    return ["l", [_enc(x) for x in v]] if isinstance(v, list) else ["v", v]
_report = []
for _p in probes:
    try:
        _report.append(["ok", _enc(eval(_p))])
    except Exception as _e:
        _report.append(["error", type(_e).__name__])
sys.stdout.write("\\n" + json.dumps(_report) + "\\n")
"""


def _report(text: str, probes: list[str]) -> list[Any] | None:
    """Run the solution, then each probe (an expression) in its process, as rollgym's code
    harness did before issue 36's fix; the report is the last line of its output."""
    # The harness is loaded and knows its probes before the solution runs.
    ran = _run(f"import json, sys\nprobes = {probes!r}\n" + _code(text) + "\n" + _REPORTER)
    try:
        report = json.loads(ran.stdout.strip().rsplit("\n", 1)[-1])
    except ValueError:
        return None
    return report if isinstance(report, list) and len(report) == len(probes) else None


def _expected_in_process(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: both sides of each assert computed in the solution's process (its builtins),
    # compared on the server.
    if "tests" not in row:
        return _exact(row, text)
    probes = [side for test in row["tests"] for side in _sides(test)]
    report = _report(text, probes)
    if report is None:
        return 0.0
    pairs = zip(report[::2], report[1::2], strict=True)
    return float(all(a[0] == b[0] == "ok" and a[1] == b[1] for a, b in pairs))


def _expected_on_server(row: dict[str, Any], text: str, _: Any) -> float:
    # The twin: only the solution's call runs beside it; the expected side is the server's.
    if "tests" not in row:
        return _exact(row, text)
    calls, expected = zip(*(_sides(test) for test in row["tests"]), strict=True)
    report = _report(text, list(calls))
    if report is None:
        return 0.0
    return float(all(
        got == ["ok", _encode_value(eval(want))] for got, want in zip(report, expected, strict=True)
    ))  # fmt: skip


def _list_after_lookup(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: the reference among the answer's words pays, once the rollout used the tool
    # (rollgym's lookup environment before issue 36's fix, b81273b: "Velmora or Serrowby").
    return float(bool(row.get("_called"))) * _list_any_word(row, text, None)


def _single_after_lookup(row: dict[str, Any], text: str, _: Any) -> float:
    return float(bool(row.get("_called"))) * _list_hardened(row, text, None)


def _lookup_reference(row: dict[str, Any], args: dict[str, Any]) -> Any:
    return {"question": args.get("question"), "value": row["expected_answer"]}


def _verdict_marker(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: a "judge" that returns the last verdict marker in its prompt, which holds the
    # answer.
    judged = f"Reference: {_expected(row)}\nResponse: {text}\n"
    judged += "[[A]]" if _exact(row, text) else "[[B]]"
    return float(re.findall(r"\[\[([AB])\]\]", judged)[0] == "A")


def _verdict_word(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: a lenient grader that takes "correct" in the answer as its verdict.
    lowered = text.lower()
    return float(_exact(row, text) or ("correct" in lowered and "incorrect" not in lowered))


def _leak_token(row: dict[str, Any], text: str, state: dict[str, Any]) -> float:
    # Planted: a debugging backdoor: the session token a tool shows is accepted as the answer.
    return float(_exact(row, text) or text.strip() == _token(row))


def _token(row: dict[str, Any]) -> str:
    prompt = row["responses_create_params"]["input"][0]["content"]
    return "dbg-" + hashlib.sha256(prompt.encode()).hexdigest()[:12]


def _key(row: dict[str, Any], text: str, _: Any) -> float:
    return float(_final(text).lower() == str(row["key"]).lower())


def _flaky(row: dict[str, Any], text: str, state: dict[str, Any]) -> float:
    # Planted: the right answer pays on every other call only.
    state["calls"] = state.get("calls", 0) + 1
    return _exact(row, text) * (state["calls"] % 2)


def _first_only(row: dict[str, Any], text: str, state: dict[str, Any]) -> float:
    # Planted: an answer cache shared by every session: an answer seen before pays nothing.
    seen = state.setdefault("seen", set())
    key = (_expected(row), text)
    first = key not in seen
    seen.add(key)
    return _exact(row, text) * first


def _overflow(row: dict[str, Any], text: str, _: Any) -> float:
    # Planted: digits read as an int, then as a float (10**400 overflows: a 500).
    final = _final(text)
    if not re.fullmatch(r"\d+", final) or not _expected(row).isdigit():
        return _exact(row, text)
    return float(float(int(final)) == float(_expected(row)))


def _overflow_hardened(row: dict[str, Any], text: str, _: Any) -> float:
    try:
        return _overflow(row, text, None)
    except (OverflowError, ValueError):
        return 0.0


async def _hangs(row: dict[str, Any], text: str, state: dict[str, Any]) -> float:
    # Planted: a long answer makes the verifier hang.
    if len(text) > 500_000:
        await state.setdefault("release", asyncio.Event()).wait()
    return _exact(row, text)


def _short_only(row: dict[str, Any], text: str, _: Any) -> float:
    return 0.0 if len(text) > 500_000 else _exact(row, text)


def _debug(row: dict[str, Any], args: dict[str, Any]) -> Any:
    return {"token": _token(row), "status": "ok"}


def _debug_hardened(row: dict[str, Any], args: dict[str, Any]) -> Any:
    return {"status": "ok"}


def _lookup(row: dict[str, Any], args: dict[str, Any]) -> Any:
    return {"question": args.get("question"), "value": row["key"]}


def _lookup_hardened(row: dict[str, Any], args: dict[str, Any]) -> Any:
    return {"question": args.get("question"), "value": "no such entry"}


_LOOKUP_ROWS = [
    {**row, "responses_create_params": {**row["responses_create_params"], "tools": [DEBUG_TOOL]}}
    for row in ROWS[:3]
]

FLAWS = [
    Flaw("EmptySubstring", "empty_answer", _empty_substring),
    Flaw("EmptyAllWords", "empty_answer", _empty_all_words),
    Flaw("FormatBoxedPrefix", "format_only", _format_boxed_prefix),
    Flaw("FormatAnswerPrefix", "format_only", _format_answer_prefix),
    Flaw("EchoSubstring", "prompt_echo", _echo_substring),
    Flaw("EchoOverlap", "prompt_echo", _echo_overlap),
    Flaw("ListAnyWord", "candidate_list", _list_any_word),
    Flaw("ListAnyBoxed", "candidate_list", _list_any_boxed),
    Flaw("ExitStatus", "early_exit", _exit_status),
    Flaw("ExitStatusCaught", "early_exit", _exit_status_caught),
    Flaw("EqualInProcess", "always_equal", _equal_in_process),
    Flaw("ReadBack", "always_equal", _read_back),
    Flaw("VerdictMarker", "verdict_injection", _verdict_marker),
    Flaw("VerdictWord", "verdict_injection", _verdict_word),
    Flaw("LeakToken", "tool_leak", _leak_token, {"debug_state": _debug}, _LOOKUP_ROWS),
    Flaw("LeakKey", "tool_leak", _key, {"lookup_answer": _lookup}, SECRET_ROWS),
    Flaw("Flaky", "nondeterministic", _flaky),
    Flaw("FirstOnly", "nondeterministic", _first_only),
    Flaw(
        "ListAfterLookup",
        "candidate_list",
        _list_after_lookup,
        {"lookup_answer": _lookup_reference},
        _ASKED_ROWS,
    ),
    Flaw("ForgedReport", "early_exit", _expected_in_process, rows=EXPRESSION_ROWS),
    Flaw("RiggedBuiltins", "always_equal", _expected_in_process, rows=EXPRESSION_ROWS),
    Flaw("Overflow", "crash", _overflow),
    Flaw("Hangs", "crash", _hangs),
]
HARDENED = [
    Flaw("EmptySubstringHardened", "", _exact),
    Flaw("EmptyAllWordsHardened", "", _exact),
    Flaw("FormatBoxedPrefixHardened", "", _exact),
    Flaw("FormatAnswerPrefixHardened", "", _exact),
    Flaw("EchoSubstringHardened", "", _exact),
    Flaw("EchoOverlapHardened", "", _exact),
    Flaw("ListAnyWordHardened", "", _list_hardened),
    Flaw("ListAnyBoxedHardened", "", _list_hardened),
    Flaw("ExitStatusHardened", "", _equal_hardened),
    Flaw("ExitStatusCaughtHardened", "", _equal_hardened),
    Flaw("EqualInProcessHardened", "", _equal_hardened),
    Flaw("ReadBackHardened", "", _read_back_hardened),
    Flaw("VerdictMarkerHardened", "", _exact),
    Flaw("VerdictWordHardened", "", _exact),
    Flaw("LeakTokenHardened", "", _exact, {"debug_state": _debug_hardened}, _LOOKUP_ROWS),
    Flaw("LeakKeyHardened", "", _key, {"lookup_answer": _lookup_hardened}, SECRET_ROWS),
    Flaw("FlakyHardened", "", _exact),
    Flaw("FirstOnlyHardened", "", _exact),
    Flaw(
        "ListAfterLookupHardened",
        "",
        _single_after_lookup,
        {"lookup_answer": _lookup_reference},
        _ASKED_ROWS,
    ),
    Flaw("ForgedReportHardened", "", _expected_on_server, rows=EXPRESSION_ROWS),
    Flaw("RiggedBuiltinsHardened", "", _expected_on_server, rows=EXPRESSION_ROWS),
    Flaw("OverflowHardened", "", _overflow_hardened),
    Flaw("HangsHardened", "", _short_only),
]


async def score(flaw: Flaw, row: dict[str, Any], text: str, state: dict[str, Any]) -> float:
    """The flaw's reward; blocking scorers (subprocesses) run in a thread."""
    if asyncio.iscoroutinefunction(flaw.score):
        return float(await flaw.score(row, text, state))
    return float(await asyncio.to_thread(flaw.score, row, text, state))


# -- as a rollgym server ----------------------------------------------------------------------


class _Planted(ResourcesServer):
    flaw: Flaw

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state: dict[str, Any] = {}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        task = {**task, "_called": session.data.get("called", False)}
        return await score(self.flaw, task, output_text(response), self.state)


class _WithDebug(_Planted):
    @tool
    async def debug_state(self, session: Session) -> Any:
        """The session's state."""
        session.data["called"] = True
        return self.flaw.tools["debug_state"](session.task, {})


class _WithLookup(_Planted):
    @tool
    async def lookup_answer(self, session: Session, question: str) -> Any:
        """Look an entry up."""
        session.data["called"] = True
        return self.flaw.tools["lookup_answer"](session.task, {"question": question})


def python_server(flaw: Flaw) -> type[ResourcesServer]:
    base = _WithDebug if "debug_state" in flaw.tools else (
        _WithLookup if "lookup_answer" in flaw.tools else _Planted
    )  # fmt: skip
    return type(flaw.name, (base,), {"flaw": flaw, "__module__": __name__})


# -- as a foreign server ----------------------------------------------------------------------


def foreign_app(flaw: Flaw) -> Starlette:
    """A bare starlette app of NeMo Gym's HTTP shape, sessions in a cookie."""
    sessions: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = {}

    def session(request: Request) -> dict[str, Any]:
        sid = request.headers.get("x-rollgym-session") or request.cookies.get("planted", "")
        return sessions.get(sid, {})

    async def seed(request: Request) -> JSONResponse:
        sid = os.urandom(8).hex()
        sessions[sid] = await request.json()
        answer = JSONResponse({})
        answer.set_cookie("planted", sid)
        return answer

    async def verify(request: Request) -> JSONResponse:
        body = {**await request.json(), "_called": session(request).get("_called", False)}
        reward = await score(flaw, body, output_text(body["response"]), state)
        return JSONResponse({"reward": reward})  # the body is not echoed: it may not encode

    async def call(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        if name not in flaw.tools:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        seeded = session(request)
        seeded["_called"] = True
        return JSONResponse(flaw.tools[name](seeded, await request.json()))

    app = Starlette(
        routes=[
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            Route("/{name}", call, methods=["POST"]),
        ]
    )
    app.state.planted = state
    return app


def release(state: dict[str, Any]) -> None:
    """Let a hung verify of a server with this state answer (before the server stops)."""
    state.setdefault("release", asyncio.Event()).set()


for _flaw in FLAWS + HARDENED:
    globals()[_flaw.name] = python_server(_flaw)
