"""A code row's tests and how a run is judged against them (no process is started here).

The row format is NeMo Gym's ``code_gen`` (LiveCodeBench's): ``verifier_metadata.unit_tests``
with ``inputs`` and ``outputs`` (stdin -> expected stdout; with ``fn_name``, each input is one
JSON argument per line and each output the JSON result), plus rollgym's ``asserts`` (Python
snippets run after the solution; a test passes when the program exits 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollgym.config import format_validation_error
from rollgym.envs.code.launcher import RESULT_MARKER
from rollgym.envs.code.sandbox import Mode, RunResult
from rollgym.errors import InvalidRequest

Scoring = Literal["all", "fraction"]


class UnitTests(BaseModel):
    model_config = ConfigDict(extra="allow")
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    fn_name: str | None = None
    asserts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _paired(self) -> UnitTests:
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if not self.inputs and not self.asserts:
            raise ValueError("no tests: give inputs/outputs or asserts")
        return self


@dataclass(frozen=True)
class Case:
    """One test: what to run and what it must print (``expected`` None: exit 0 is enough)."""

    mode: Mode
    program_suffix: str
    stdin: str
    expected: str | None


def row_tests(task: dict[str, Any]) -> tuple[list[Case], UnitTests, Scoring | None]:
    """The row's cases, its unit tests and its own scoring (if it names one); 422 if bad."""
    meta = task.get("verifier_metadata")
    if not isinstance(meta, dict) or "unit_tests" not in meta:
        raise InvalidRequest("code task needs 'verifier_metadata.unit_tests'", status=422)
    try:
        tests = UnitTests.model_validate(meta["unit_tests"])
    except ValidationError as exc:
        msg = format_validation_error("verifier_metadata.unit_tests", exc, one_line=True)
        raise InvalidRequest(msg, status=422) from None
    scoring = meta.get("scoring")
    if scoring not in (None, "all", "fraction"):
        raise InvalidRequest("verifier_metadata.scoring must be 'all' or 'fraction'", status=422)
    mode: Mode = "call" if tests.fn_name else "stdio"
    cases = [Case(mode, "", i, o) for i, o in zip(tests.inputs, tests.outputs, strict=True)]
    cases += [Case("assert", "\n\n" + a + "\n", "", None) for a in tests.asserts]
    return cases, tests, scoring


def extract_code(text: str) -> str | None:
    """The last fenced code block (LiveCodeBench's rule: between the last two lines holding
    a fence), or None."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    code = "\n".join(lines[fences[-2] + 1 : fences[-1]])
    return code if code.strip() else None


def outcome(case: Case, run: RunResult) -> str:
    """``passed``, ``wrong_answer``, ``runtime_error``, ``time_limit`` or ``output_limit``."""
    if run.timed_out:
        return "time_limit"
    if run.output_exceeded:
        return "output_limit"
    if run.exit_code != 0:
        return "runtime_error"
    if case.expected is None:
        return "passed"
    if case.mode == "call":
        return "passed" if _same_result(run.stdout, case.expected) else "wrong_answer"
    return "passed" if _same_stdout(run.stdout, case.expected) else "wrong_answer"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(x) for x in line.split()]
    except InvalidOperation:
        return None


def _same_stdout(got: str, expected: str) -> bool:
    """LiveCodeBench's comparison: stripped lines equal, or equal as decimal numbers."""
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        dx, dy = _decimals(x), _decimals(y)
        if dx is None or dy is None or dx != dy:
            return False
    return True


def _same_result(stdout: str, expected: str) -> bool:
    """A call-based result: equal as JSON values, or as floats within tolerance."""
    marked = [line for line in stdout.split("\n") if line.startswith(RESULT_MARKER)]
    if not marked:
        return False
    try:
        got, want = json.loads(marked[-1][len(RESULT_MARKER) :]), json.loads(expected)
    except ValueError:
        return False
    if got == want:
        return True
    try:
        return math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-8)
    except (TypeError, ValueError):
        return False
