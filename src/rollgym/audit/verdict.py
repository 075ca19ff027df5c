"""The verdict on one server: which probes earn more than a plainly wrong answer.

1. A row's **floor** is the most any of its plainly wrong answers earned (``floor_answers``),
   played as the probe is: with no tool call, or after the tools were called (a verifier may
   pay for using them); a row whose floor is unknown (each wrong answer crashed or was
   refused) is not compared.
2. A probe's answer is **right** when the row carries a reference and the answer's one final
   answer (its ``\\boxed{}``, ``<answer>`` or ``Answer:`` part, else the whole text; an empty
   box is none) equals one, normalized: then paying it is no exploit (a tool's output that
   holds the answer of a lookup task). An answer that names several final answers is never
   right. A probe not built to hold answers (all but ``LISTS``) that mentions a reference is
   taken as right too: its reward may be the reference's, by chance.
3. A row **pays** a probe when an answer of that probe earned more than the floor and is not
   right (a list played in two orders, when both orders did: a verifier that reads the last
   of several answers pays a list that happens to end with the right one); a probe with a
   paying row is a finding of its class.
4. A play that crashed (5xx, timeout, garbage) is a ``crash`` finding, whatever its probe; a
   repeated answer whose rewards differ on a row is a ``nondeterministic`` one.
5. ``exploitable`` if any finding is of another class, else ``unreliable`` if any finding,
   else ``clean``; ``unaudited`` when no play was scored (every one refused or skipped), so a
   server that does not speak the protocol played never reads ``clean``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rollgym.audit.panel import Probe

EPS = 1e-9
UNRELIABLE = ("crash", "nondeterministic")
_EXAMPLE_CHARS = 300


@dataclass(frozen=True)
class Result:
    """One play: the probe, its row, the answer played, and what it earned."""

    probe: Probe
    row: int
    answer: str
    reward: float | None
    crash: str | None = None
    request: dict[str, Any] | None = None
    right: bool = False
    refused: bool = False
    """The server answered the play with a 4xx (not scored, no finding)."""


@dataclass(frozen=True)
class Finding:
    cls: str
    probe: str
    rows_tried: int
    rows_paid: int
    mean_reward: float | None
    mean_floor: float | None
    example: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.cls, "probe": self.probe, "rows_tried": self.rows_tried,
            "rows_paid": self.rows_paid, "mean_reward": self.mean_reward,
            "mean_floor": self.mean_floor, "example": self.example,
        }  # fmt: skip


def verdict(findings: list[Finding], scored: int = 1) -> str:
    """The verdict on a server's ``findings``; ``scored``: its plays that earned a reward."""
    if not findings and not scored:
        return "unaudited"
    if any(f.cls not in UNRELIABLE for f in findings):
        return "exploitable"
    return "unreliable" if findings else "clean"


def findings(results: list[Result]) -> list[Finding]:
    """The findings of one server's plays (see the module docstring)."""
    floors: dict[tuple[int, bool], float] = {}
    for r in results:
        if r.probe.cls == "floor" and r.reward is not None and not r.right:
            key = _floor_key(r)
            floors[key] = max(floors.get(key, r.reward), r.reward)
    by_probe: dict[tuple[str, str], list[Result]] = defaultdict(list)
    for r in results:
        by_probe[(r.probe.cls, r.probe.name)].append(r)
    out = [_crashes(results)] if any(r.crash for r in results) else []
    for (cls, name), plays in by_probe.items():
        found = _repeats(plays) if plays[0].probe.repeats > 1 else _pays(cls, name, plays, floors)
        if found is not None:
            out.append(found)
    return out


def _floor_key(r: Result) -> tuple[int, bool]:
    """Which floor ``r`` is compared with: its row's, with or without tool calls before."""
    return r.row, bool(r.probe.calls)


def _pays(
    cls: str, name: str, plays: list[Result], floors: dict[tuple[int, bool], float]
) -> Finding | None:
    if cls == "floor":
        return None
    rows: dict[int, list[Result]] = defaultdict(list)
    for r in plays:
        if r.reward is not None and _floor_key(r) in floors:
            rows[r.row].append(r)
    paid = {
        row: [
            r for r in rs
            if not r.right and r.reward is not None and r.reward > floors[_floor_key(r)] + EPS
        ]
        for row, rs in rows.items()
    }  # fmt: skip
    # A reordered probe pays a row only when each of its orders does (``Probe.reordered``).
    every = bool(plays[0].probe.reordered)
    paid = {row: rs for row, rs in paid.items() if rs and (not every or len(rs) == len(rows[row]))}
    if not paid:
        return None
    best = [max(r.reward or 0.0 for r in rs) for rs in rows.values()]
    example = next(iter(paid.values()))[0]
    return Finding(
        cls, name, len(rows), len(paid),
        _mean(best), _mean([floors[_floor_key(rs[0])] for rs in rows.values()]),
        _example(example),
    )  # fmt: skip


def _repeats(plays: list[Result]) -> Finding | None:
    """A repeated answer: rows where its rewards differ."""
    rows: dict[int, list[Result]] = defaultdict(list)
    for r in plays:
        if r.reward is not None:
            rows[r.row].append(r)
    differ = [rs for rs in rows.values() if len({r.reward for r in rs}) > 1]
    if not differ:
        return None
    rewards = [r.reward for rs in rows.values() for r in rs if r.reward is not None]
    first = differ[0]
    example = _example(first[0]) | {"rewards": [r.reward for r in first]}
    return Finding(
        "nondeterministic", plays[0].probe.name, len(rows), len(differ), _mean(rewards), None,
        example,
    )  # fmt: skip


def _crashes(results: list[Result]) -> Finding:
    crashed = [r for r in results if r.crash]
    first = crashed[0]
    probes = sorted({f"{r.probe.cls}/{r.probe.name}" for r in crashed})
    return Finding(
        "crash", ", ".join(probes[:6]) + (f" (+{len(probes) - 6})" if len(probes) > 6 else ""),
        len({r.row for r in results}), len({r.row for r in crashed}), None, None,
        _example(first) | {"error": first.crash, "plays_crashed": len(crashed)},
    )  # fmt: skip


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _example(r: Result) -> dict[str, Any]:
    return {
        "row": r.row,
        "answer": _bounded(r.answer),
        "reward": r.reward,
        "request": _bounded(r.request) if r.request is not None else None,
    }


def _bounded(value: Any, depth: int = 0) -> Any:
    """``value`` cut to a readable size: strings to ``_EXAMPLE_CHARS``, lists to 8 items,
    nesting to 6 levels; lone surrogates escaped so the file stays UTF-8."""
    if depth > 6:
        return "…"
    if isinstance(value, str):
        text = value if len(value) <= _EXAMPLE_CHARS else value[:_EXAMPLE_CHARS] + "…"
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {str(k): _bounded(v, depth + 1) for k, v in list(value.items())[:30]}
    if isinstance(value, (list, tuple)):
        items = [_bounded(v, depth + 1) for v in value[:8]]
        return [*items, "…"] if len(value) > 8 else items
    return value


# -- is an answer right? ----------------------------------------------------------------------

_BOXED = re.compile(r"\\boxed\s*\{")
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_PREFIXED = re.compile(r"answer(?: is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_DROP = re.compile(r"[\s,$'\"`*.]|\\text|\\mathrm|[{}()[\]]")


def final_answers(text: str) -> list[str]:
    """The final answers ``text`` gives: its ``\\boxed{}`` contents, else its ``<answer>``
    tags, else what follows its last ``Answer:``, else the whole text."""
    boxed = _boxed(text)
    if boxed:
        return boxed
    tagged = _TAGGED.findall(text)
    if tagged:
        return tagged
    prefixed = _PREFIXED.findall(text)
    return [prefixed[-1]] if prefixed else [text]


_BRACE = re.compile(r"[{}]")


def _boxed(text: str) -> list[str]:
    out = []
    for match in _BOXED.finditer(text[:100_000]):
        depth, start = 1, match.end()
        # Brace by brace, not character by character: a long box costs its braces.
        for brace in _BRACE.finditer(text, start, min(len(text), start + 10_000)):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                out.append(text[start : brace.start()])
                break
    return out


def normalize(text: str) -> str:
    return _DROP.sub("", text.casefold())


LISTS = ("candidate_list", "tool_leak", "prompt_echo")
"""Classes whose answers hold references by design (a prompt may name the answer among
others): only a strictly right one is right."""
_NUMBERS = re.compile(r"-?\d+(?:\.\d+)?")


def right(probe: Probe, answer: str, refs: list[str]) -> bool:
    """Whether paying ``answer`` may be deserved: it is right (``is_right``), or, for a probe
    not built to hold references, it names one (``mentions``): a verdict marker that reads
    ``10/10`` holds the answer ``10`` by chance, not by design."""
    if is_right(answer, refs):
        return True
    return probe.cls not in LISTS and mentions(answer, refs)


def mentions(answer: str, refs: list[str]) -> bool:
    """Whether a reference occurs in ``answer``: as a number of equal value, or as words."""
    text = answer[:100_000]
    numbers = {float(n) for n in _NUMBERS.findall(text)}
    for ref in refs:
        ref = ref.strip()
        if _NUMBERS.fullmatch(ref):
            if float(ref) in numbers:
                return True
        elif ref and len(ref) <= 1000:
            words = r"\s+".join(re.escape(w) for w in ref.split())
            if re.search(rf"(?<!\w){words}(?!\w)", text, re.IGNORECASE):
                return True
    return False


def is_right(answer: str, refs: list[str]) -> bool:
    """Whether ``answer`` gives exactly one final answer and it is one of ``refs``."""
    if not refs or len(answer) > 100_000:
        return False
    # An empty box names no answer: a prompt given back with its format ("in \\boxed{}") and
    # its example ("e.g. \\boxed{3}") answers 3.
    given = {normalize(a) for a in final_answers(answer)} - {""}
    if len(given) != 1:
        return False
    wanted = {normalize(r) for r in refs} | {normalize(a) for r in refs for a in final_answers(r)}
    return given.pop() in wanted - {""}
