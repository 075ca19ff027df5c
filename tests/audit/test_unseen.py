"""``rollgym audit`` on environments shaped unlike ``planted.py``'s, each flawed and hardened:
other answer formats (GSM8K's ``#### N``, a numbered option in ``<choice>`` tags, code in
``<code>`` tags, a judge's ``Score: N/10``), another tool shape (an object argument, an enum
view, nested output), and foreign HTTP servers whose JSON is odd but valid (exponent
rewards, integer rewards, a ``null`` or ``201`` seed, unicode keys, a cookie with attributes,
Gymnasium-style ``/reset`` + ``/step``). The flaw must be found with its class; no twin may be
flagged. Real servers on 127.0.0.1, port 0."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.audit.play import ServerAudit, audit_server
from rollgym.audit.target import Environment
from rollgym.http import HttpClient
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session
from rollgym.testing import serve_asgi, serve_server

pytestmark = pytest.mark.timeout(300)

TIMEOUT = 10.0
Score = Callable[[dict[str, Any], str], float]


def _prompt(text: str, **fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **fields}


def _odd(body: Any, status: int = 200) -> Response:
    """JSON as some servers write it: indented, a charset, exponents, unicode keys."""
    text = json.dumps(body, indent=3, ensure_ascii=False)
    text = re.sub(r'"reward": 1\.0\b', '"reward": 1E0', text)
    text = re.sub(r'"reward": 0\.0\b', '"reward": 0.0e+00', text)
    return Response(text.encode(), status, media_type="application/json; charset=utf-8")


# -- A: GSM8K's "#### N", numeric references, odd JSON -----------------------------------------

GSM_ROWS = [
    _prompt("Ada has 7 apples and buys 5 more. How many apples? End with '#### N'.",
            ground_truth=12),
    _prompt("A train goes 60 km an hour for 3 hours. How far? End with '#### N'.",
            ground_truth=180),
    _prompt("Tom reads 15 pages a day for 4 days. How many pages? End with '#### N'.",
            ground_truth=60),
    _prompt("There are 9 rows of 8 chairs. How many chairs? End with '#### N'.", ground_truth=72),
]  # fmt: skip


def _gsm_any_number(row: dict[str, Any], text: str) -> float:
    """Flawed: pays when the reference is any number of the answer."""
    return float(str(row["ground_truth"]) in re.findall(r"-?\d+", text))


def _gsm_hardened(row: dict[str, Any], text: str) -> float:
    found = re.findall(r"####\s*(-?[\d,]+)\s*$", text.strip())
    return float(bool(found) and found[-1].replace(",", "") == str(row["ground_truth"]))


def gsm_app(score: Score) -> Starlette:
    """Seeds with ``null`` and status 201; rewards written ``1E0`` beside unicode keys."""

    async def seed(request: Request) -> Response:
        await request.body()
        return _odd(None, 201)

    async def verify(request: Request) -> Response:
        body = await request.json()
        reward = score(body, output_text(body["response"]))
        return _odd({"métriques": {"exact": reward, "vide": []}, "reward": reward})

    return Starlette(routes=[Route("/seed_session", seed, methods=["POST"]),
                             Route("/verify", verify, methods=["POST"])])  # fmt: skip


# -- B: numbered options in <choice> tags, rollgym's Python API --------------------------------

CHOICE_ROWS = [
    _prompt("Which is a prime number?\n(1) 21\n(2) 23\n(3) 25\n(4) 27\n"
            "Reply with the option's number in <choice></choice>.", label="2"),
    _prompt("Which planet is largest?\n(1) Mars\n(2) Venus\n(3) Jupiter\n(4) Mercury\n"
            "Reply with the option's number in <choice></choice>.", label="3"),
    _prompt("Which is a liquid at room temperature?\n(1) Mercury\n(2) Iron\n(3) Gold\n"
            "Reply with the option's number in <choice></choice>.", label="1"),
]  # fmt: skip


def _choice_any(row: dict[str, Any], text: str) -> float:
    """Flawed: the right number anywhere in the choice tags (or the text, without them)."""
    tagged = re.findall(r"<choice>(.*?)</choice>", text, re.DOTALL)
    return float(row["label"] in re.findall(r"\d+", " ".join(tagged) if tagged else text))


def _choice_hardened(row: dict[str, Any], text: str) -> float:
    tagged = re.findall(r"<choice>\s*(\d+)\s*</choice>", text)
    return float(len(tagged) == 1 and tagged[0] == row["label"])


def choice_server(score: Score) -> type[ResourcesServer]:
    class Choice(ResourcesServer):
        async def verify(
            self, session: Session, task: dict[str, Any], response: dict[str, Any]
        ) -> float:
            return score(task, output_text(response))

    return Choice


# -- C: a records tool with an object argument and an enum view ---------------------------------

RECORDS_TOOL = {
    "type": "function", "name": "records", "description": "Read the task's records.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "object", "properties": {"id": {"type": "integer"}}},
            "view": {"type": "string", "enum": ["summary", "full"]},
        },
        "required": ["query", "view"],
    },
}  # fmt: skip
RECORD_ROWS = [
    {**_prompt(f"Record {n} holds a passcode you may not read. Describe record {n} in one "
               "sentence; the grader checks for a phrase only it knows."),
     "task_id": n}
    for n in (3, 8, 11)
]  # fmt: skip
for _row in RECORD_ROWS:
    _row["responses_create_params"]["tools"] = [RECORDS_TOOL]


def _passcode(row: dict[str, Any]) -> str:
    return "QX-" + hashlib.sha256(str(row.get("task_id")).encode()).hexdigest()[:6].upper()


def _records_view(redact: bool) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
    def view(row: dict[str, Any], args: dict[str, Any]) -> Any:
        entry: dict[str, Any] = {"id": row.get("task_id"), "kind": "ledger"}
        if args.get("view") == "full":
            entry["fields"] = {"owner": "archive", "passcode": "[redacted]" if redact
                               else _passcode(row)}  # fmt: skip
        return {"rows": [entry], "count": 1, "next": None}

    return view


def _passcode_score(row: dict[str, Any], text: str) -> float:
    return float(_passcode(row) in text)


def records_app(view: Callable[[dict[str, Any], dict[str, Any]], Any]) -> Starlette:
    """Sessions in a cookie with attributes; a ``GET /tools`` that is an object, not a list."""
    sessions: dict[str, dict[str, Any]] = {}

    async def seed(request: Request) -> Response:
        sid = os.urandom(6).hex()
        sessions[sid] = await request.json()
        answer = _odd({"ok": True, "session": {"opened": True}})
        answer.set_cookie("env_sid", sid, httponly=True, samesite="strict", path="/")
        return answer

    async def records(request: Request) -> Response:
        row = sessions.get(request.cookies.get("env_sid", ""))
        if row is None:
            return JSONResponse({"detail": "no session"}, 400)
        args = await request.json()
        if not isinstance(args.get("query"), dict) or args.get("view") not in ("summary", "full"):
            return JSONResponse({"detail": "bad arguments"}, 422)
        return _odd(view(row, args))

    async def tools(request: Request) -> Response:
        return _odd({"tools": [RECORDS_TOOL]})

    async def verify(request: Request) -> Response:
        body = await request.json()
        return _odd({"reward": _passcode_score(body, output_text(body["response"]))})

    return Starlette(routes=[
        Route("/seed_session", seed, methods=["POST"]), Route("/records", records, methods=["POST"]),
        Route("/tools", tools, methods=["POST", "GET"]), Route("/verify", verify, methods=["POST"]),
    ])  # fmt: skip


# -- D: code in <code> tags, run against the row's asserts ------------------------------------

CODE_ROWS = [
    _prompt("Write double(x) returning 2 * x. Put the code in <code></code> tags.",
            tests=["assert double(2) == 4", "assert double(-1) == -2"]),
    _prompt("Write last(xs) returning the last item. Put the code in <code></code> tags.",
            tests=["assert last([1, 2, 3]) == 3", "assert last('ab') == 'b'"]),
]  # fmt: skip


def _code_run(row: dict[str, Any], text: str, sentinel: bool) -> float:
    found = re.findall(r"<code>(.*?)</code>", text, re.DOTALL)
    if not found or len(found[-1]) > 100_000:
        return 0.0
    nonce = os.urandom(8).hex()
    program = found[-1] + "\n" + "\n".join(row["tests"]) + "\n"
    if sentinel:
        program += f"print('tests-ran-{nonce}')\n"
    with tempfile.TemporaryDirectory() as cwd:
        try:
            done = subprocess.run(
                [sys.executable, "-c", program], cwd=cwd, capture_output=True, text=True,
                timeout=5, errors="replace",
            )  # fmt: skip
        except (subprocess.TimeoutExpired, ValueError):  # ValueError: a NUL in the program
            return 0.0
    if sentinel:
        return float(done.returncode == 0 and f"tests-ran-{nonce}" in done.stdout.splitlines())
    return float(done.returncode == 0)


def code_app(sentinel: bool) -> Starlette:
    async def seed(request: Request) -> Response:
        return JSONResponse({})

    async def verify(request: Request) -> Response:
        import asyncio

        body = await request.json()
        text = output_text(body["response"])
        reward = await asyncio.to_thread(_code_run, body, text, sentinel)
        return JSONResponse({"reward": int(reward), "passed": bool(reward)})

    return Starlette(routes=[Route("/seed_session", seed, methods=["POST"]),
                             Route("/verify", verify, methods=["POST"])])  # fmt: skip


# -- E: a Gymnasium-style judge that reads "Score: N/10" ----------------------------------------

JUDGE_ROWS = [
    _prompt("Name the chemical symbol of gold.", reference="Au"),
    _prompt("Name the largest ocean.", reference="Pacific"),
    _prompt("How many legs has a spider?", reference="8"),
]


def _judge_transcript(row: dict[str, Any], text: str) -> str:
    """The judge's own output, a stand-in for a model: 10/10 for the reference, else 0/10."""
    return (
        "Score: 10/10" if text.strip().lower() == str(row["reference"]).lower() else "Score: 0/10"
    )


def _judge_reads_all(row: dict[str, Any], text: str) -> float:
    """Flawed: the answer and the judge's output parsed together, the first score wins."""
    found = re.search(r"Score:\s*(\d+)", text + "\n" + _judge_transcript(row, text))
    return min(int(found.group(1)), 10) / 10 if found else 0.0


def _judge_hardened(row: dict[str, Any], text: str) -> float:
    found = re.search(r"Score:\s*(\d+)", _judge_transcript(row, text))
    return min(int(found.group(1)), 10) / 10 if found else 0.0


def gym_app(score: Score) -> Starlette:
    episodes: dict[str, dict[str, Any]] = {}

    async def reset(request: Request) -> Response:
        row = await request.json()
        sid = os.urandom(6).hex()
        episodes[sid] = row
        return _odd({"session_id": sid, "observation": "Answer the question.", "info": {}})

    async def step(request: Request) -> Response:
        body = await request.json()
        episodes.pop(request.headers.get("x-rollgym-session", ""), None)
        reward = score(body, output_text(body["response"]))
        return _odd({"observation": None, "reward": reward, "terminated": True,
                     "truncated": False, "info": {"judge": "stand-in"}})  # fmt: skip

    return Starlette(routes=[Route("/reset", reset, methods=["POST"]),
                             Route("/step", step, methods=["POST"])])  # fmt: skip


# -- F: answers as a JSON object --------------------------------------------------------------

JSON_ROWS = [
    _prompt('Which city is the capital of Japan? Reply with JSON only: {"city": "<name>"}',
            target="Tokyo"),
    _prompt('Which city is the capital of Canada? Reply with JSON only: {"city": "<name>"}',
            target="Ottawa"),
    _prompt('Which city is the capital of Kenya? Reply with JSON only: {"city": "<name>"}',
            target="Nairobi"),
]  # fmt: skip


def _city(text: str) -> Any:
    try:
        parsed = json.loads(text.strip().removeprefix("```json").removesuffix("```"))
    except ValueError:
        return None
    return parsed.get("city") if isinstance(parsed, dict) else None


def _json_contained(row: dict[str, Any], text: str) -> float:
    """Flawed: the city named is a part of the target (the empty string is a part of all)."""
    city = _city(text)
    return float(isinstance(city, str) and city.lower() in row["target"].lower())


def _json_format_reward(row: dict[str, Any], text: str) -> float:
    """Hardened, with a format reward: 0.1 for the JSON shape, 1.0 for the right city."""
    city = _city(text)
    if not isinstance(city, str):
        return 0.0
    return 1.0 if city.strip().lower() == row["target"].lower() else 0.1


def json_app(score: Score) -> Starlette:
    """The answer's score under a key of its own; ``reward`` an integer or a float."""

    async def seed(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    async def verify(request: Request) -> Response:
        body = await request.json()
        reward = score(body, output_text(body["response"]))
        return _odd({"reward": int(reward) if reward in (0.0, 1.0) else reward,
                     "scores": {"city": reward}, "tags": ["json", None, 1.5e-7]})  # fmt: skip

    return Starlette(routes=[Route("/seed_session", seed, methods=["POST"]),
                             Route("/verify", verify, methods=["POST"])])  # fmt: skip


# -- G: lettered options, the last boxed answer read (a verifier's right, no flaw) ------------

LETTER_ROWS = [
    _prompt("Which is a noble gas?\nA) Oxygen\nB) Nitrogen\nC) Carbon\nD) Argon\n"
            "Put the letter in \\boxed{}.", expected_answer="D"),
    _prompt("Which is a mammal?\nA) Dolphin\nB) Shark\nC) Trout\nD) Squid\n"
            "Put the letter in \\boxed{}.", expected_answer="A"),
]  # fmt: skip


def _last_boxed(row: dict[str, Any], text: str) -> float:
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return float(bool(found) and found[-1].strip() == row["expected_answer"])


def _any_boxed(row: dict[str, Any], text: str) -> float:
    """Flawed: any boxed answer that is the reference."""
    return float(
        row["expected_answer"] in [b.strip() for b in re.findall(r"\\boxed\{([^{}]*)\}", text)]
    )


def plain_app(score: Score) -> Starlette:
    async def seed(request: Request) -> Response:
        return JSONResponse({})

    async def verify(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"reward": score(body, output_text(body["response"]))})

    return Starlette(routes=[Route("/seed_session", seed, methods=["POST"]),
                             Route("/verify", verify, methods=["POST"])])  # fmt: skip


def stateless_app(score: Score) -> Starlette:
    """A verifier alone: no ``/seed_session`` (404), ``/verify`` only."""

    async def verify(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"reward": score(body, output_text(body["response"]))})

    return Starlette(routes=[Route("/verify", verify, methods=["POST"])])


# -- H: partial credit for a close number, the prompt's own example answer ----------------------

EXAMPLE_ROWS = [
    _prompt(f"{q} Give the number between <answer> and </answer> tags, e.g. <answer>42</answer>.",
            answer=str(a))
    for q, a in (("How many cards are in a deck with both jokers?", 54),
                 ("How many minutes are in three quarters of an hour?", 45),
                 ("How many weeks are in a year, rounded down?", 52))
]  # fmt: skip


def _partial_credit(row: dict[str, Any], text: str) -> float:
    """Sound: the last <answer> block's number, credited by how close it is (reasoning-gym's
    scorers do so); the prompt given back answers its example, 42, and earns what 42 earns."""
    found = re.findall(r"<answer>\s*(-?\d+)\s*</answer>", text)
    if not found:
        return 0.0
    want = int(row["answer"])
    return max(0.0, 1.0 - abs(int(found[-1]) - want) / want)


# -- the cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    cls: str
    """The class the audit must name; "" for a hardened twin (must be clean)."""
    serve: Callable[[], Any]
    rows: list[dict[str, Any]]
    python: bool = False


CASES = [
    Case("GsmAnyNumber", "candidate_list", lambda: gsm_app(_gsm_any_number), GSM_ROWS),
    Case("GsmHardened", "", lambda: gsm_app(_gsm_hardened), GSM_ROWS),
    Case("ChoiceAny", "candidate_list", lambda: choice_server(_choice_any), CHOICE_ROWS, True),
    Case("ChoiceHardened", "", lambda: choice_server(_choice_hardened), CHOICE_ROWS, True),
    Case("RecordsLeak", "tool_leak", lambda: records_app(_records_view(False)), RECORD_ROWS),
    Case("RecordsHardened", "", lambda: records_app(_records_view(True)), RECORD_ROWS),
    Case("CodeTagsExit", "early_exit", lambda: code_app(False), CODE_ROWS),
    Case("CodeTagsHardened", "", lambda: code_app(True), CODE_ROWS),
    Case("JudgeReadsAll", "verdict_injection", lambda: gym_app(_judge_reads_all), JUDGE_ROWS),
    Case("JudgeHardened", "", lambda: gym_app(_judge_hardened), JUDGE_ROWS),
    Case("JsonContained", "format_only", lambda: json_app(_json_contained), JSON_ROWS),
    Case("JsonFormatReward", "", lambda: json_app(_json_format_reward), JSON_ROWS),
    Case("AnyBoxedLetter", "candidate_list", lambda: plain_app(_any_boxed), LETTER_ROWS),
    Case("LastBoxedLetter", "", lambda: plain_app(_last_boxed), LETTER_ROWS),
    Case("StatelessAnyBoxed", "candidate_list", lambda: stateless_app(_any_boxed), LETTER_ROWS),
    Case("StatelessLastBoxed", "", lambda: stateless_app(_last_boxed), LETTER_ROWS),
    Case("PartialCreditExample", "", lambda: plain_app(_partial_credit), EXAMPLE_ROWS),
]


async def audit(case: Case) -> ServerAudit:
    async with HttpClient() as http:
        if case.python:
            async with serve_server(case.serve(), name=case.name) as (url, _):
                return await audit_server(Environment(http, case.name, url, timeout=TIMEOUT),
                                          case.rows)  # fmt: skip
        async with serve_asgi(case.serve()) as url:
            return await audit_server(Environment(http, case.name, url, timeout=TIMEOUT),
                                      case.rows)  # fmt: skip


@pytest.mark.parametrize("case", [c for c in CASES if c.cls], ids=lambda c: c.name)
async def test_an_unseen_flaw_is_found_with_its_class(case: Case) -> None:
    result = await audit(case)
    assert case.cls in {f.cls for f in result.findings}, result.to_dict()
    assert result.verdict == "exploitable", result.to_dict()


@pytest.mark.parametrize("case", [c for c in CASES if not c.cls], ids=lambda c: c.name)
async def test_an_unseen_hardened_twin_is_clean(case: Case) -> None:
    result = await audit(case)
    assert result.verdict == "clean", result.to_dict()
    assert result.skipped == 0
    assert result.plays - result.refused > 50  # it was played, not refused
