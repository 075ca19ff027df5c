"""Which option a reply chose, by the row's grading mode: NeMo Gym 0.4.0's modes
(``resources_servers/mcqa``), reproduced rule for rule so a row scores the same on either side,
and rollgym's own ``rollgym_lenient`` (``extract.extract_choice``).

Order: the reply's text is stripped (empty: no answer); the row's
``template_metadata.output_regex`` patterns are tried first, then the grading mode.

Its rules are kept even where they surprise (each is pinned by a test in
``tests/envs/test_mcqa_grading.py``):
- ``strict_single_letter_boxed`` reads the first ``\\boxed{...}`` holding one uppercase letter
  among non-letters; ``\\boxed{\\text{B}}`` and ``Answer: B`` are no answer.
- ``lenient_answer_colon`` reads the rest of the line after the first ``answer:``: ``Answer: B.``
  and ``**Answer:** B`` are no answer (it is one letter, or an option's whole text).
- A template regex that captures a letter is trusted even when the letter is no option.
- Messages are joined with nothing between them (``protocol.output_text``), so a
  ``lenient_answer_colon`` reply ``Answer: B`` followed by a message ``Thanks`` reads
  ``Answer: BThanks``: no answer.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from rollgym.envs.mcqa.extract import extract_choice
from rollgym.envs.mcqa.task import GradingMode, MCQATask

log = logging.getLogger("rollgym.envs.mcqa")

# One uppercase letter alone among non-letters in a box: \boxed{B}, \boxed{(B)}, \boxed{ B. }.
# [^A-Za-z] also crosses braces and lines. The reference pattern,
# "\\boxed\{\s*[^A-Za-z]*([A-Z])[^A-Za-z]*\s*\}", is the same language
# without its "\s*", which "[^A-Za-z]*" already reads (the overlap made it quadratic in spaces).
_STRICT_BOXED = re.compile(r"\\boxed\{[^A-Za-z]*([A-Z])[^A-Za-z]*\}")
_BOX_OPEN = "\\boxed{"
_TEXT_OPEN = "\\text{"
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
# **Answer: B**, __Answer__: B, Answer:** b ...: one letter, not followed by a letter or digit.
_ANSWER_COLON_MD = re.compile(
    r"[*_]{0,2}Answer[*_]{0,2}\s*:[*_\s]{0,2}\s*([A-Z])(?![a-zA-Z0-9])", re.IGNORECASE
)
# Option letters of other scripts read as A-D in a template regex's capture:
# Arabic, Bengali and fullwidth Latin.
_OTHER_SCRIPTS = (
    "\u0623\u0628\u062c\u062f",
    "\u0985\u09ac\u09a1\u09a2",
    "\uff21\uff22\uff23\uff24",
)
_FOREIGN_LETTERS = str.maketrans(
    {ch: f" {latin}" for chars in _OTHER_SCRIPTS for ch, latin in zip(chars, "ABCD", strict=True)}
)


def choose(text: str, task: MCQATask, mode: GradingMode) -> str | None:
    """The letter ``text`` chose under ``mode`` (after the row's template regex), or None."""
    text = text.strip()
    if not text:
        return None
    if task.output_regex is not None:
        for pattern in task.output_regex:
            letter = _by_template(text, pattern, task)
            if letter is not None:
                return letter
    return _MODES[mode](text, task)


def _by_template(text: str, pattern: str, task: MCQATask) -> str | None:
    try:
        found = re.findall(pattern, text, re.IGNORECASE)
    except re.error as exc:
        _warn_bad_pattern(pattern, str(exc))
        return None
    if not found:
        return None
    captured = str(found[-1]).strip().translate(_FOREIGN_LETTERS).strip().upper()
    if len(captured) == 1 and captured.isalpha():
        return captured  # trusted even if no option has this letter
    return _equal_text(captured, task)


@functools.lru_cache(maxsize=64)
def _warn_bad_pattern(pattern: str, error: str) -> None:
    # The fallback grading mode decides instead; the warning is rollgym's (the reference is silent).
    log.warning(
        "mcqa: output_regex %r does not compile (%s); using the grading mode", pattern, error
    )


def _strict_boxed(text: str, task: MCQATask) -> str | None:
    m = _STRICT_BOXED.search(text)
    return m.group(1) if m is not None and m.group(1) in task.letters else None


def _lenient_boxed(text: str, task: MCQATask) -> str | None:
    letter = _strict_boxed(text, task)
    if letter is not None:
        return letter
    inner = _first_box(text)
    if inner is None:
        return None
    candidates = [_normalize(inner), _normalize(_unwrap_text(inner))]
    matched = {
        letter
        for letter, option in task.options
        if (norm := _normalize(option)) and any(norm in c for c in candidates)
    }
    # Containment, so the box may say more than the option; two options contained: no answer.
    return matched.pop() if len(matched) == 1 else None


def _first_box(text: str) -> str | None:
    """The first box's content up to the first closing brace, stripped, as the reference pattern
    reads it; found by index, linear where that pattern is quadratic (many unclosed boxes)."""
    start = text.find(_BOX_OPEN)
    if start < 0:
        return None
    end = text.find("}", start + len(_BOX_OPEN))
    return None if end < 0 else text[start + len(_BOX_OPEN) : end].strip()


def _answer_colon(text: str, task: MCQATask) -> str | None:
    m = _ANSWER_COLON.search(text)
    if m is None:
        return None
    candidate = _unwrap_text(m.group(1)).strip()
    if len(candidate) == 1 and candidate.isalpha() and candidate.upper() in task.letters:
        return candidate.upper()
    return _equal_text(candidate, task)


def _answer_colon_md(text: str, task: MCQATask) -> str | None:
    m = _ANSWER_COLON_MD.search(text)
    letter = m.group(1).upper() if m is not None else None
    return letter if letter in task.letters else None


def _rollgym_lenient(text: str, task: MCQATask) -> str | None:
    return extract_choice(text, sorted(task.letters))


def _equal_text(candidate: str, task: MCQATask) -> str | None:
    """The first option whose whole text is ``candidate`` (case and spacing aside)."""
    wanted = _normalize(candidate)
    return next((letter for letter, option in task.options if _normalize(option) == wanted), None)


def _unwrap_text(s: str) -> str:
    """``s`` without the ``\\text{...}`` wrappers that enclose all of it, each one's content
    stripped (the reference pattern, as a fullmatch, by index: linear in ``s``)."""
    start, end = 0, len(s)
    while end - start > len(_TEXT_OPEN) and s.startswith(_TEXT_OPEN, start) and s[end - 1] == "}":
        start, end = start + len(_TEXT_OPEN), end - 1
        while start < end and s[start].isspace():
            start += 1
        while end > start and s[end - 1].isspace():
            end -= 1
    return s[start:end]


def _normalize(s: str) -> str:
    return " ".join(s.lower().split())


_MODES: dict[str, Callable[[str, MCQATask], str | None]] = {
    "strict_single_letter_boxed": _strict_boxed,
    "lenient_boxed": _lenient_boxed,
    "lenient_answer_colon": _answer_colon,
    "lenient_answer_colon_md": _answer_colon_md,
    "rollgym_lenient": _rollgym_lenient,
}
