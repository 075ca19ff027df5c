"""A code row's tests and how a run is judged against them (no process is started here).

The row format is ``code_gen``'s (LiveCodeBench's): ``verifier_metadata.unit_tests`` with ``inputs``
and ``outputs`` (stdin -> expected stdout; with ``fn_name``, each input is one JSON argument per
line and each output the JSON result), plus rollgym's ``asserts`` (``assert`` statements over the
solution's names, judged by the server: ``asserts.py``). Every comparison is made here, in the
server, never in the sandbox: a program's exit status or hooks cannot make a test pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollgym.config import format_validation_error
from rollgym.envs.code.asserts import Judged, parse_assert
from rollgym.envs.code.codec import ProbeSpec
from rollgym.envs.code.decode import read_report
from rollgym.envs.code.launcher import READY
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
    """One test: what to run, and what it must print (stdio, call) or hold (``judged``)."""

    mode: Mode
    stdin: str
    expected: str | None
    judged: Judged | None = None

    @property
    def probes(self) -> tuple[ProbeSpec, ...]:
        return self.judged.probes if self.judged else ()


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
    cases = [Case(mode, i, o) for i, o in zip(tests.inputs, tests.outputs, strict=True)]
    for n, source in enumerate(tests.asserts):
        judged = parse_assert(source, f"verifier_metadata.unit_tests.asserts[{n}]")
        cases.append(Case("assert", "", None, judged))
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


def outcome(case: Case, run: RunResult) -> tuple[str, str | None]:
    """``passed``, ``wrong_answer``, ``runtime_error``, ``time_limit`` or ``output_limit``, and
    why when not passed. Whatever the program printed, never raises."""
    if run.timed_out:
        # Not the measured seconds: a verifier field that reads the clock differs between a
        # run and its replay (rollgym replay) while nothing about the answer does.
        return "time_limit", "still running at the wall-clock limit"
    if run.output_exceeded:
        return "output_limit", "printed more than the output limit"
    report = run.report[len(READY) :] if run.report.startswith(READY) else b""
    if case.judged is not None:
        try:
            values = read_report(report, len(case.judged.probes))
            if isinstance(values, str):
                return "runtime_error", _why(values, run)
            held, why = case.judged.judge(values)
        except Exception as exc:  # whatever the program reported, never the verifier's error
            return "runtime_error", f"the report could not be judged: {type(exc).__name__}"
        return ("passed", None) if held else ("wrong_answer", why)
    if run.exit_code != 0:
        return "runtime_error", _why(f"exit code {run.exit_code}", run)
    if case.mode == "call":
        same = _same_result(report, case.expected or "")
    else:
        same = _same_stdout(run.stdout, case.expected or "")
    return ("passed", None) if same else ("wrong_answer", "the output differs from the expected")


def _why(what: str, run: RunResult) -> str:
    last = run.stderr.strip().rsplit("\n", 1)[-1][:200]
    return f"{what}: {last}" if last else what


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    """The line's numbers, or None if it is not all finite numbers (``sNaN`` included:
    comparing one raises)."""
    try:
        numbers = [Decimal(x) for x in line.split()]
    except (InvalidOperation, ValueError):
        return None
    return numbers if all(d.is_finite() for d in numbers) else None


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


def _same_result(report: bytes, expected: str) -> bool:
    """A call-based result: equal as JSON values, or as floats within tolerance."""
    lines = report.strip().split(b"\n")
    try:
        got, want = json.loads(lines[-1]), json.loads(expected)
        if got == want:
            return True
        return math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-8)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        return False
