"""Find which option letter a free-text answer chose.

``extract_choice`` reads the *last* explicit answer (``\\boxed{B}``, ``Answer: B``, ``the answer
is (B)``, ``**Answer:** B``, ``I'd go with B``); without one it accepts only a reply that ends
unmistakably (a lone letter, ``... B)``, ``Therefore, B.``). An answer naming two options
(``A or C``, ``\\boxed{A, C}``) or a letter outside the options is no answer: None, never a guess.
So is a list of options, however it is written (``A B C D``, one letter per line, ``(A)(B)``,
``\\boxed{A}\\boxed{B}``, ``Answer: A\nAnswer: B``): a policy must not be paid for naming every
option. A later answer still corrects an earlier one when words come between them
(``Answer: A. Wait, actually the answer is C``).

The text is model output, so every step is linear in its length: braces are matched in one pass
and no pattern backtracks over what it has already read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# LaTeX text wrappers inside math: \text{B}, \textbf{(B)}, \mathrm{B} ...
_WRAPPER = re.compile(
    r"\\(?:text|textbf|textrm|textit|textsf|texttt|mathrm|mathbf|mathit|mathsf|mbox)\s*\{([^{}]*)\}"
)
_MATH_DELIMS = re.compile(r"\$+|\\[()\[\]]")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")

# A lowercase letter is a choice only when nothing word-like follows: "answer is a lot" is not A.
_LETTER = (
    r"(?:\(\s*[A-Za-z]\s*\)|\[\s*[A-Za-z]\s*\]|[A-Z](?![\w'\u2019-])|[a-z](?=\s*$|[.,;:!?)\]}]))"
)
_MARKER = re.compile(
    r"(?i:\banswer\b(?:\s+(?:is|would\s+be|should\s+be|must\s+be|will\s+be))?\s*(?:[:=\-\u2013]\s*)?"
    r"(?:is\s*:?\s*)?"
    r"|\b(?:correct|right|best|final)\s+(?:option|choice)\b(?:\s+(?:is|would\s+be|must\s+be))?"
    r"\s*[:=\-\u2013]?\s*"
    r"|\bI(?:'d|\s+would|\s+will)?\s+(?:choose|pick|select|go\s+with)\s+)"
    r"(?i:(?:option|choice|letter)\s+)?(?:\\boxed\s*\{\s*)?"
    rf"(?P<choice>{_LETTER})",
    re.MULTILINE,
)
_SEPARATOR = r"(?:,|;|/|&|\||\+|\band/or\b|\bor\b|\band\b)"
# A second option right after the first: "A or C", "A, C", "A/C", "A and C", "A; C", "A | C".
_ALSO = re.compile(
    rf"\s*{_SEPARATOR}\s*(?i:(?:option|choice)\s+)?(?P<choice>{_LETTER})",
    re.MULTILINE,
)
# Nothing but more option letters up to the end of the text: "A B C D", "(A) (B)", "A\nB\nC".
_MORE_LETTERS = re.compile(
    rf"[.:)\]]?(?:\s*{_SEPARATOR}?\s*(?P<choice>\(\s*[A-Za-z]\s*\)|\[\s*[A-Za-z]\s*\]|"
    r"\b[A-Z]\b)[.:)\]]?)+\s*[.!]?\s*$"
)
# What may stand between two answers of one list: "\boxed{A} or \boxed{B}", "Answer: A\nAnswer: B".
_JOINED = re.compile(
    rf"(?:[\s.:)\]}}*$]|{_SEPARATOR}|(?i:\b(?:the|final|correct|answer|is|option|choice)\b))*"
)
_BOX_CONTENT = re.compile(
    r"\s*(?i:(?:option|choice)\s+)?(?:\(\s*(?P<p>[A-Za-z])\s*\)|(?P<l>[A-Za-z])(?=[.:)\s]|$))"
    r"[.:)]?(?P<rest>.*)",
    re.DOTALL,
)
# Endings that answer without a marker: "... B)", "(B).", "Therefore, B."
_TRAILING_PAREN = re.compile(r"(?:^|[^\w])\(?(?P<choice>[A-Za-z])\)\s*[.!]?\s*$")
_TRAILING_CONCLUSION = re.compile(
    r"(?i:\b(?:so|thus|therefore|hence)\b,?\s+(?:(?:it|that)(?:'s|\s+is|\s+must\s+be)\s+)?)"
    r"\(?(?P<choice>[A-Z])\)?\s*[.!]?\s*$"
)
_BEFORE_OR = re.compile(
    rf"(?:(?P<choice>{_LETTER})\s*{_SEPARATOR}|(?P<listed>\(\s*[A-Za-z]\s*\)|\b[A-Z]\)?)[.]?)"
    r"\s*(?i:(?:option|choice)\s+)?$"
)
_LONE_LETTER = re.compile(r"[\s.:;!'\"()\[\]*]*(?P<choice>[A-Za-z])[\s.:;!'\"()\[\]*]*")
_MAX_UNWRAP = 16  # nesting of \text{\textbf{...}} unwrapped; deeper is no answer anyone writes

_INVALID = ""  # an explicit answer that names no single valid option


def _letter(token: str) -> str:
    return token.strip("()[] \t").upper()


def _clean(text: str) -> str:
    previous = None
    for _ in range(_MAX_UNWRAP):  # each pass unwraps one level; bounded, as the text is hostile
        if previous == text:
            break
        previous, text = text, _WRAPPER.sub(r"\1", text)
    text = _MATH_DELIMS.sub(" ", text)
    return text.replace("*", "")


def _closing_braces(text: str) -> dict[int, int]:
    """The position of the ``}`` closing each ``{``, in one pass (unclosed ones are absent)."""
    closing: dict[int, int] = {}
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            closing[opened.pop()] = i
    return closing


def _boxed(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every ``\\boxed{...}``, braces balanced."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return []
    closing = _closing_braces(text)
    found = []
    for match in matches:
        end = closing.get(match.end() - 1)
        if end is not None:
            found.append((match.start(), end + 1, text[match.end() : end]))
    return found


def _single(choice: str, text: str, pos: int, valid: set[str]) -> str:
    """``choice`` as a letter, or ``_INVALID`` if it is no option or another option follows it
    at ``pos`` of ``text`` ("A or C", or nothing but more letters: "A B C D")."""
    letter = _letter(choice)
    if letter not in valid:
        return _INVALID
    also = _ALSO.match(text, pos)
    if also is not None and _letter(also.group("choice")) in valid:
        return _INVALID
    more = _MORE_LETTERS.match(text, pos)
    if more is not None and any(
        _letter(token) in valid for token in re.findall(r"[A-Za-z]", more.group(0))
    ):
        return _INVALID
    return letter


def _explicit(text: str, valid: set[str]) -> list[tuple[int, int, str]]:
    """(start, end, letter or ``_INVALID``) of every explicit answer."""
    answers = []
    for start, end, content in _boxed(text):
        m = _BOX_CONTENT.fullmatch(content)
        if m is None:
            answers.append((start, end, _INVALID))
        else:
            choice = m.group("p") or m.group("l")
            answers.append((start, end, _single(choice, content, m.start("rest"), valid)))
    for m in _MARKER.finditer(text):
        letter = _letter(m.group("choice"))
        if letter == "I" and "I" not in valid:
            continue  # "the answer: I think..." is the pronoun, not an option
        answers.append(
            (m.start("choice"), m.end(), _single(m.group("choice"), text, m.end(), valid))
        )
    return answers


def _final(text: str, answers: list[tuple[int, int, str]]) -> str:
    """The last answer's letter, or ``_INVALID`` if it ends a list of answers naming other
    options (``\\boxed{A}\\boxed{B}``, ``Answer: A\nAnswer: B``): a hedge, not a correction."""
    answers = sorted(answers)
    *earlier, (start, _, letter) = answers
    for prev_start, prev_end, prev_letter in reversed(earlier):
        if prev_end > start or prev_start == start:
            continue  # a marker inside a box, or the box's own reading
        if _JOINED.fullmatch(text, prev_end, start) is None:
            break  # words between them: a later answer corrects an earlier one
        if prev_letter != letter:
            return _INVALID
        start = prev_start
    return letter


def _trailing(text: str, valid: set[str]) -> str | None:
    stripped = text.strip()
    lines = stripped.rsplit("\n", 2)
    last_line = lines[-1].strip(" \t.:;!'\"()[]")
    if len(last_line) == 1 and last_line.isalpha():
        if len(lines) > 1:
            before = _LONE_LETTER.fullmatch(lines[-2])
            if before is not None and _letter(before.group("choice")) in valid:
                return None  # one letter per line: a list of options, not an answer
        return last_line.upper() if last_line.upper() in valid else None
    for pattern in (_TRAILING_PAREN, _TRAILING_CONCLUSION):
        m = pattern.search(stripped)
        if m is None:
            continue
        letter = _letter(m.group("choice"))
        end = m.start("choice")
        while end > 0 and stripped[end - 1] in "( ":
            end -= 1
        before = _BEFORE_OR.search(stripped, 0, end)
        named = None if before is None else before.group("choice") or before.group("listed")
        if named is not None and _letter(named) in valid:
            return None  # "A or B)", "(A)(B)", "A) B)"
        return letter if letter in valid else None
    return None


def extract_choice(text: str, letters: Iterable[str]) -> str | None:
    """The option letter (uppercase) that ``text`` answers with, or None if it names none or
    several. ``letters`` are the valid options, e.g. ``"ABCD"``."""
    valid = {letter.strip().upper() for letter in letters}
    cleaned = _clean(text)
    answers = _explicit(cleaned, valid)
    if answers:
        return _final(cleaned, answers) or None
    return _trailing(cleaned, valid)
