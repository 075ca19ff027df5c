"""Every dataset the installed reasoning-gym registers, through the environment's real verify:
rows made by ``make_rows`` (so carried through JSON), scored over HTTP by a served
``ReasoningGymEnv`` with its CPU pool. For each: the reference answer scores 1.0, a wrong one
less, and adversarial answers (the question itself, the reference twice, nested tags, a
zero-width character, a hedge of a wrong answer and the reference) less, except where listed below with the reason. Three rows a dataset:
about 5 s to make them and 12 s to verify them on an idle 2-core machine.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollgym.envs.reasoning_gym import guard
from rollgym.envs.reasoning_gym.tasks import (
    WRONG_ANSWER,
    DatasetChoice,
    make_rows,
    offered,
    registry,
)
from rollgym.testing import serve_server

from .env_client import reply

pytestmark = pytest.mark.timeout(240)

ROWS = 3

NO_REFERENCE: dict[str, Callable[[dict[str, Any]], str] | None] = {
    # The entry's ``answer`` is None: any valid solution counts, checked by the scorer.
    # Where the entry holds one solution, it stands in for the reference.
    "graph_color": lambda row: json.dumps(row["metadata"]["possible_answer"]),
    "propositional_logic": lambda row: str(row["metadata"]["example_answer"]),
    "rubiks_cube": lambda row: str(row["metadata"]["example_correct_answer"]),
    # No solution in the entry (the scorer simulates the answer's moves): only the wrong
    # answers are checked.
    "boxnet": None,
    "rush_hour": None,
}

NOT_OFFERED = set(guard.BROKEN)
"""game_of_life_halting: its scorer gives every non-empty answer 1.0 (``guard.BROKEN``)."""

LENIENT: dict[tuple[str, str], str] = {
    # (dataset, adversarial answer) that its own scorer gives 1.0: it reads the part of the
    # answer it understands and ignores the rest. Not unearned: each of these answers holds
    # the reference, but a scorer for exact answers would refuse them.
    ("fraction_simplification", "twice"): "reads the first fraction",
    ("gsm_symbolic", "twice"): "reads the first number",
    ("gsm_symbolic", "nested"): "reads the number after the inner <answer>",
    ("kakurasu", "nested"): "reads the grid's digits, ignores other text",
    ("kakurasu", "zero_width"): "reads the grid's digits, ignores other text",
    ("knights_knaves", "twice"): "reads each person's verdict, repeated ones agree",
    ("letter_jumble", "twice"): "scores word by word over the reference's words",
    ("propositional_logic", "zero_width"): "its own parser skips characters it does not know",
    ("quantum_lock", "zero_width"): "keeps only the button letters of the sequence",
    ("sokoban", "twice"): "replays the moves until solved, ignores the rest",
    ("sokoban", "nested"): "keeps only the move letters",
    ("sokoban", "zero_width"): "keeps only the move letters",
    ("time_intervals", "twice"): "reads the first duration",
    ("tower_of_hanoi", "nested"): "reads the move lines, ignores others",
    # "I do not know, or <reference>": the same leniency; none of these takes a list of every
    # option (knights_knaves scores "A is a knight, A is a knave, ..." 0).
    ("gsm_symbolic", "hedge"): "reads the number",
    ("kakurasu", "hedge"): "reads the grid's digits",
    ("knights_knaves", "hedge"): "reads each person's verdict",
    ("quantum_lock", "hedge"): "keeps only the button letters",
    ("sokoban", "hedge"): "keeps only the move letters",
    ("survo", "hedge"): "reads the grid's numbers",
}

RAISED: dict[tuple[str, str], str] = {
    # (dataset, answer) scored 0 with ``scorer_raised``: the scorer raises on it.
    ("prime_factorization", "wrong"): "int() of each factor: ValueError on words",
    ("prime_factorization", "question"): "int() of each factor: ValueError on words",
    ("prime_factorization", "twice"): "int() of '433 2' (factors split on ' x ')",
    ("prime_factorization", "nested"): "int() of '<answer>2'",
    ("prime_factorization", "zero_width"): "int() of a factor with U+200B in it",
    ("prime_factorization", "hedge"): "int() of 'I do not know, or 2'",
    # The reference followed by junk sums 1/len per matching letter to 1.0000000000000002,
    # which misses the scorer's `== 1.0` penalty: out of [0, 1], no score of its.
    ("spell_backward", "twice"): "score 1.0000000000000002, outside [0, 1]",
}


def _adversarial(row: dict[str, Any], reference: str | None) -> dict[str, str]:
    out = {"wrong": WRONG_ANSWER, "question": f"<answer>{row['question']}</answer>"}
    if reference:
        out["twice"] = f"<answer>{reference} {reference}x</answer>"
        out["nested"] = f"<answer><answer>{reference}</answer></answer>"
        out["zero_width"] = f"<answer>{reference[:1]}\u200b{reference[1:]}</answer>"
        # every option at once: a wrong one, then the reference
        out["hedge"] = f"<answer>I do not know, or {reference}</answer>"
    return out


@pytest.fixture(scope="module")
def sweep_rows() -> list[dict[str, Any]]:
    with _no_network():
        return [
            row
            for name in sorted(registry())
            if name not in NOT_OFFERED
            for row in make_rows([DatasetChoice(name)], ROWS, seed=0)
        ]


@pytest.fixture
def no_network() -> Iterator[None]:
    with _no_network():
        yield


class _NetworkUsed(AssertionError):
    pass


class _no_network:
    """Any connection but to loopback fails: generation must need nothing from the network."""

    def __enter__(self) -> None:
        self._connect = socket.socket.connect

        def connect(sock: socket.socket, address: Any) -> Any:
            host = address[0] if isinstance(address, tuple) else str(address)
            if host not in ("127.0.0.1", "::1", "localhost") and sock.family != socket.AF_UNIX:
                raise _NetworkUsed(f"a connection to {address!r}")
            return self._connect(sock, address)

        socket.socket.connect = connect  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        socket.socket.connect = self._connect  # type: ignore[method-assign]


def test_every_registered_dataset_has_rows(sweep_rows: list[dict[str, Any]]) -> None:
    made = {row["reasoning_gym"]["dataset"] for row in sweep_rows}
    assert made == set(registry()) - NOT_OFFERED
    assert made == set(offered())  # the count the docs state (test_reasoning_gym)
    assert len(made) >= 100  # composite left out (weights mix datasets here), and BROKEN


async def test_reference_scores_one_and_wrong_answers_less(
    sweep_rows: list[dict[str, Any]],
) -> None:
    found_lenient: set[tuple[str, str]] = set()
    found_raised: set[tuple[str, str]] = set()
    problems: list[str] = []
    timeout = aiohttp.ClientTimeout(total=60, connect=5)
    async with (
        serve_server("reasoning_gym", name="rg") as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):

        async def verify(row: dict[str, Any], text: str) -> dict[str, Any]:
            async with http.post(url + "/verify", json={**row, "response": reply(text)}) as r:
                body = await r.json()
                assert r.status == 200, body
                return dict(body)

        for row in sweep_rows:
            name = row["reasoning_gym"]["dataset"]
            reference = row["answer"]
            if reference is None:
                assert name in NO_REFERENCE, f"{name}: no reference answer, and not listed"
                make = NO_REFERENCE[name]
                reference = make(row) if make else None
            if reference is not None:
                body = await verify(row, f"<answer>{reference}</answer>")
                if body["reward"] != 1.0:
                    problems.append(f"{name}: reference scored {body['reward']} {body}")
            for kind, text in _adversarial(row, reference).items():
                body = await verify(row, text)
                assert not body.get("mask_sample"), body  # an answer always gets a score
                if body.get("reason") == "scorer_raised":
                    assert body["reward"] == 0.0
                    found_raised.add((name, kind))
                elif body["reward"] >= 1.0:
                    found_lenient.add((name, kind))
    assert not problems, "\n".join(problems)
    assert found_lenient == set(LENIENT), sorted(found_lenient ^ set(LENIENT))
    assert found_raised == set(RAISED), sorted(found_raised ^ set(RAISED))


PROBES = [
    *("", "0", "1", "-1", "0.0", "0.5", "1/8", "0,0", "1 1", "True", "False", "None", "null"),
    *("nan", "NaN", "-nan", "nan+nanj", "nani", "inf", "-inf", "Infinity", "1e999", "1e-999"),
    *("[]", "{}", "()", "[[]]", "[nan]", "x", "x-x", "x/x", "0/0", "1/0", "zoo", "oo", "E", "I"),
    *("pi", "yes", "no", "a", "1*2*3*4", "N(pi, 30)", "9" * 400, "00:00", "0 days, 00:00"),
]
"""Answers a policy could try on any row: degenerate values, NaN and infinities, free symbols."""


def _same(answer: str, reference: str) -> bool:
    """The probe is the reference itself, written otherwise ("yes"/"Yes", "1"/"1.0")."""
    if answer.strip().lower() == reference.strip().lower():
        return True
    try:
        return float(answer) == float(reference)
    except ValueError:
        return False


async def test_no_probe_answer_earns_full_reward(sweep_rows: list[dict[str, Any]]) -> None:
    """The first row of each dataset against ``PROBES``: none scores 1.0 unless it is the
    reference. (Partial credit is the dataset's own: time_intervals gives 0.95 for a date
    five days off.) This found complex_arithmetic's 1.0 for "nan", coin_flip's for "0" and
    puzzle24's for "1*2*3*4"."""
    first: dict[str, dict[str, Any]] = {}
    for row in sweep_rows:
        first.setdefault(row["reasoning_gym"]["dataset"], row)
    unearned = []
    async with (
        serve_server("reasoning_gym", name="rg") as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, connect=5)) as http,
    ):
        for name, row in first.items():
            reference = row["answer"] if isinstance(row["answer"], str) else ""
            for probe in PROBES:
                if reference and _same(probe, reference):
                    continue
                answer = reply(f"<answer>{probe}</answer>")
                async with http.post(url + "/verify", json={**row, "response": answer}) as r:
                    body = await r.json()
                assert r.status == 200, body
                if body["reward"] >= 1.0:
                    unearned.append(f"{name}: {probe!r} scored {body['reward']}")
    assert unearned == []


NEMO_REFUSED = {
    "arc_agi": "compares the answer's board with the entry's tuples",
    "rearc": "compares the answer's board with the entry's tuples",
}
"""Datasets whose NeMo Gym-shaped rows (no type patches) are refused: their reference would
score wrong (arc_agi's 0.05)."""


async def test_nemo_gym_shaped_rows_score_as_carried_ones_or_are_refused(
    sweep_rows: list[dict[str, Any]],
) -> None:
    """The first row of each dataset without its ``reasoning_gym`` field, as NeMo Gym's rows
    come: its reference scores as the carried row's does, or the row is refused (422)."""
    first: dict[str, dict[str, Any]] = {}
    for row in sweep_rows:
        first.setdefault(row["reasoning_gym"]["dataset"], row)
    refused, differ = set(), []
    async with (
        serve_server("reasoning_gym", name="rg") as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, connect=5)) as http,
    ):
        for name, row in first.items():
            if not isinstance(row["answer"], str) or row["reasoning_gym"]["config"]:
                continue
            answer = reply(f"<answer>{row['answer']}</answer>")
            bare = {k: v for k, v in row.items() if k != "reasoning_gym"}
            async with http.post(url + "/verify", json={**bare, "response": answer}) as r:
                body = await r.json()
            if r.status == 422:
                assert "NeMo Gym-shaped" in body["error"]["message"]
                refused.add(name)
            elif (r.status, body["reward"]) != (200, 1.0):
                differ.append(f"{name}: {r.status} {body}")
    assert differ == []
    assert refused == set(NEMO_REFUSED)


async def test_arc_boards_score_one_only_with_their_types_restored(
    sweep_rows: list[dict[str, Any]],
) -> None:
    """Why rows carry ``restore``: arc_agi compares the answer's board (tuples) with the
    entry's; as NeMo Gym's rows carry it (JSON lists), the reference scores 0.05 (a NeMo Gym
    row of arc_agi is refused: ``NEMO_REFUSED``)."""
    row = next(r for r in sweep_rows if r["reasoning_gym"]["dataset"] == "arc_agi")
    bare = {**row, "reasoning_gym": {**row["reasoning_gym"], "restore": []}}
    answer = reply(f"<answer>{row['answer']}</answer>")
    async with (
        serve_server("reasoning_gym", name="rg") as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        rewards = []
        for r in (row, bare):
            async with http.post(url + "/verify", json={**r, "response": answer}) as resp:
                rewards.append((await resp.json())["reward"])
    assert rewards == [1.0, 0.05]


def test_rows_are_the_same_in_processes_of_different_hash_seeds(tmp_path: Path) -> None:
    """A generator iterating a set of strings would differ between processes: every dataset,
    two processes with different ``PYTHONHASHSEED``, byte-identical files."""
    names = sorted(set(registry()) - NOT_OFFERED)
    args = [a for name in names for a in ("--dataset", name)]
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"rows-{hash_seed}.jsonl"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(
            [sys.executable, "-m", "rollgym", "tasks", "reasoning-gym", *args,
             "--size", str(len(names)), "--seed", "3", "--output", str(out)],
            env=env, check=True, timeout=120, capture_output=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == len(names)


NETWORK_MODULES = {"socket", "urllib.request", "http.client", "requests", "httpx", "aiohttp"}


def test_no_dataset_module_imports_a_network_client() -> None:
    """Scoring runs in pool workers, out of reach of the socket guard above; so read every
    module of the package: none imports a network client."""
    import reasoning_gym

    root = Path(reasoning_gym.__file__).parent
    importers = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n in NETWORK_MODULES or n.split(".")[0] in NETWORK_MODULES for n in names):
                importers.append(str(path.relative_to(root)))
    assert importers == []


def test_every_scorer_that_evaluates_code_is_guarded_or_read() -> None:
    """A module of a registered dataset that calls eval/exec/parse_expr must be one whose use
    was read: guarded (``guard.EVAL_ON_ANSWER``, ``guard.SYMPY_PARSED``) or shown not to touch
    the answer (``guard.EVAL_NOT_ON_ANSWER``). A new version fails here until it is read."""
    import inspect

    calls = {"eval", "exec", "parse_expr", "sympify", "parse_latex"}
    sympy_modules = {
        inspect.getmodule(registry()[name][0]).__name__  # type: ignore[union-attr]
        for name in guard.SYMPY_PARSED
    }
    read = set(guard.EVAL_ON_ANSWER) | set(guard.EVAL_NOT_ON_ANSWER) | sympy_modules
    unread = set()
    for dataset_cls, _ in registry().values():
        module = inspect.getmodule(dataset_cls)
        assert module is not None
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
                if name in calls and module.__name__ not in read:
                    unread.add(f"{module.__name__}: {name}")
    assert unread == set()
