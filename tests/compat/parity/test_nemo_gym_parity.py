"""rollgym's ``mcqa`` and ``math`` score every case of ``nemo_gym_cases.jsonl`` as NeMo Gym
0.4.0 does (its header says how the expected rewards were produced, with the exact command:
``scripts/nemo_gym_parity.py`` run against NeMo Gym's own ``/verify``).

A case agrees when both servers give the same reward (and, for mcqa, the same extracted letter),
or both refuse it (NeMo Gym's 422/500, rollgym's 422). Every case where rollgym deliberately
differs is listed in ``DIFFERENCES`` with its reason; the test fails if such a case agrees after
all (the list must stay true) or if any other case disagrees.
"""

from __future__ import annotations

import asyncio
import fnmatch
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest

from rollgym.envs.math.server import MathEnv
from rollgym.envs.mcqa.server import MCQAEnv
from rollgym.testing import serve_server

FIXTURE = Path(__file__).with_name("nemo_gym_cases.jsonl")
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "nemo_gym_parity.py"

pytestmark = pytest.mark.timeout(180)

REFUSED = "refused"
SCORED = "scored"

# Where rollgym differs from NeMo Gym 0.4.0 on purpose: case id pattern (fnmatch) -> (what
# rollgym answers: a reward, REFUSED or SCORED (some reward), why). A failure is not a reward of 0 (DESIGN.md), and a row rollgym
# cannot grade as written is refused naming the field, where NeMo Gym scores 0 for every reply.
DIFFERENCES: dict[str, tuple[float | str, str]] = {
    "mcqa/edge/expected_missing/*": (REFUSED, "no expected_answer: NeMo Gym scores every reply 0"),
    "mcqa/edge/expected_not_an_option/*": (
        REFUSED,
        "expected_answer is no option: NeMo Gym scores every reply 0",
    ),
    "mcqa/edge/expected_not_an_option_template/*": (
        REFUSED,
        "expected_answer is no option; NeMo Gym pays it only through a template regex",
    ),
    "mcqa/edge/option_key_not_a_letter/*": (
        REFUSED,
        "an option keyed '1': NeMo Gym drops it silently",
    ),
    "mcqa/edge/option_letter_twice/*": (
        REFUSED,
        "two options lettered C: NeMo Gym grades with both, first text wins",
    ),
    "mcqa/edge/regex_two_groups/not_matching": (
        REFUSED,
        "an output_regex with two groups: NeMo Gym fails (500) once it matches; rollgym refuses "
        "the row whatever the reply",
    ),
    "mcqa/edge/rollgym_dict_options/*": (
        1.0,
        "options as a dict: NeMo Gym refuses the row (422); rollgym grades it, rollgym_lenient",
    ),
    "mcqa/edge/rollgym_text_options/*": (
        1.0,
        "options as a list of texts: NeMo Gym refuses the row (422); rollgym grades it",
    ),
    "mcqa/*/user_message_in_output": (
        SCORED,
        "a user message among the output items: NeMo Gym fails (500, its output_text reads the "
        "message's parts as objects); rollgym reads the assistant's messages only",
    ),
    "math/edge/unparseable_gold/*": (
        REFUSED,
        "an expected_answer math-verify cannot parse: NeMo Gym scores every reply 0",
    ),
    "math/edge/empty_gold/*": (REFUSED, "an empty expected_answer: NeMo Gym scores every reply 0"),
    "math/edge/no_question": (1.0, "NeMo Gym requires 'question' (judge prompt); rollgym not"),
    "math/edge/number_gold": (1.0, "a numeric expected_answer: NeMo Gym refuses it (422)"),
}


@dataclass(frozen=True)
class Outcome:
    reward: float | None  # None: refused
    extracted: str | None = None

    def show(self) -> str:
        return REFUSED if self.reward is None else f"{self.reward} ({self.extracted})"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nemo_gym_parity", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fixture's header and its cases, rows resolved."""
    first, *lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    head = json.loads(first)
    cases = [json.loads(line) for line in lines]
    for case in cases:
        case["row"] = head["rows"][case["row"]]
    return head["header"], cases


def nemo_outcome(case: dict[str, Any]) -> Outcome:
    nemo = case["nemo"]
    if nemo["status"] != 200:
        return Outcome(None)
    return Outcome(float(nemo["reward"]), nemo.get("extracted_answer"))


# Differences that come from math-verify, not from rollgym: the fixture was made with NeMo Gym's
# pin (math-verify 0.8.0); another installed version may compare some answers otherwise.
MATH_VERIFY_DIFFERENCES: dict[str, tuple[float | str, str]] = {
    "math/edge/percent/1": (
        1.0,
        "gold 10%, reply 10: math-verify 0.9 compares a percentage with an integer by value",
    ),
}


def differences(header: dict[str, Any]) -> dict[str, tuple[float | str, str]]:
    """``DIFFERENCES``, plus ``MATH_VERIFY_DIFFERENCES`` when math-verify is not NeMo Gym's."""
    same = importlib.metadata.version("math-verify") == header["versions"]["math-verify"]
    return DIFFERENCES if same else {**DIFFERENCES, **MATH_VERIFY_DIFFERENCES}


def documented(
    case_id: str, docs: dict[str, tuple[float | str, str]]
) -> tuple[str, float | str] | None:
    """(the pattern, what rollgym answers) of the difference ``case_id`` falls under."""
    for pattern, (answer, _) in docs.items():
        if fnmatch.fnmatchcase(case_id, pattern):
            return pattern, answer
    return None


async def _verify(
    http: aiohttp.ClientSession, url: str, case: dict[str, Any], wrap: Any, gate: asyncio.Semaphore
) -> Outcome:
    body = {**case["row"], "response": wrap(case["output"])}
    async with gate, http.post(url + "/verify", json=body) as resp:
        answer = await resp.json()
    if resp.status == 422:
        return Outcome(None)
    assert resp.status == 200, (case["id"], answer)
    return Outcome(float(answer["reward"]), answer.get("extracted_answer"))


async def rollgym_outcomes(cases: list[dict[str, Any]]) -> list[Outcome]:
    """Every case verified over HTTP by a real rollgym server of its env and server options."""
    wrap = _script().response
    groups: dict[tuple[str, str], list[int]] = {}
    for i, case in enumerate(cases):
        key = (case["env"], json.dumps(case["server_options"], sort_keys=True))
        groups.setdefault(key, []).append(i)
    outcomes: list[Outcome | None] = [None] * len(cases)
    timeout = aiohttp.ClientTimeout(total=60, connect=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for (env, options), indices in groups.items():
            klass = MCQAEnv if env == "mcqa" else MathEnv
            gate = asyncio.Semaphore(16)
            async with serve_server(klass, name=env, options=json.loads(options)) as (url, _):
                results = await asyncio.gather(
                    *(_verify(http, url, cases[i], wrap, gate) for i in indices)
                )
            for i, outcome in zip(indices, results, strict=True):
                outcomes[i] = outcome
    assert all(o is not None for o in outcomes)
    return outcomes  # type: ignore[return-value]


def _agree(env: str, ours: Outcome, theirs: Outcome) -> bool:
    if env == "math":  # NeMo Gym's math extracted_answer is a sympy string; rollgym has none
        return ours.reward == theirs.reward
    return ours == theirs


def test_fixture_says_how_it_was_made() -> None:
    header, cases = load()
    assert header["command"].endswith("scripts/nemo_gym_parity.py")
    assert header["versions"]["nemo-gym"] == "0.4.0"
    envs = {case["env"] for case in cases}
    assert envs == {"mcqa", "math"}
    modes = {case["row"].get("grading_mode") for case in cases if case["env"] == "mcqa"}
    assert {"strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"} <= modes
    assert any(case["server_options"] for case in cases)
    assert any("template_metadata" in case["row"] for case in cases)
    # Both NeMo Gym outcomes occur, so agreement is not trivially "everything scores 0".
    rewards = [case["nemo"].get("reward") for case in cases]
    assert rewards.count(1.0) > 300 and rewards.count(0.0) > 300


async def test_rollgym_scores_every_case_as_nemo_gym() -> None:
    header, cases = load()
    docs = differences(header)
    ours = await rollgym_outcomes(cases)
    disagree, stale, used = [], [], set()
    for case, mine in zip(cases, ours, strict=True):
        theirs = nemo_outcome(case)
        doc = documented(case["id"], docs)
        seen = f"{case['id']}: rollgym {mine.show()}, NeMo Gym {theirs.show()}"
        if doc is None:
            if not _agree(case["env"], mine, theirs):
                disagree.append(seen)
            continue
        pattern, answer = doc
        used.add(pattern)
        if answer == SCORED:
            holds = mine.reward is not None
        else:
            holds = mine.reward == (None if answer == REFUSED else answer)
        if not holds or _agree(case["env"], mine, theirs):
            stale.append(seen)
    documented_n = sum(1 for c in cases if documented(c["id"], docs))
    print(
        f"\nNeMo Gym parity: {len(cases)} cases, {len(cases) - documented_n - len(disagree)} "
        f"agreed, {documented_n} documented differences, {len(disagree)} undocumented",
        file=sys.stderr,
    )
    assert not disagree, "\n".join(disagree[:60])
    assert not stale, "documented differences that do not hold:\n" + "\n".join(stale)
    assert used == set(docs), f"differences no case shows: {set(docs) - used}"
