"""Find which option letter a free-text answer chose.

``extract_choice`` reads the *last* explicit answer (``\\boxed{B}``, ``Answer: B``, ``the answer
is (B)``, ``**Answer:** B``, ``I'd go with B``); without one it accepts only a reply that ends
unmistakably (a lone letter, ``... B)``, ``Therefore, B.``). An answer naming two options
(``A or C``, ``\\boxed{A, C}``) or a letter outside the options is no answer: None, never a guess.
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
# A second option right after the first: "A or C", "A, C", "A/C", "A and C".
_ALSO = re.compile(
    rf"\s*(?:,|/|&|\bor\b|\band\b)\s*(?i:(?:option|choice)\s+)?(?P<choice>{_LETTER})",
    re.MULTILINE,
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
    rf"(?P<choice>{_LETTER})\s*(?:,|/|&|\bor\b|\band\b)\s*(?i:(?:option|choice)\s+)?$"
)

_INVALID = ""  # an explicit answer that names no single valid option


def _letter(token: str) -> str:
    return token.strip("()[] \t").upper()


def _clean(text: str) -> str:
    previous = None
    while previous != text:
        previous, text = text, _WRAPPER.sub(r"\1", text)
    text = _MATH_DELIMS.sub(" ", text)
    return text.replace("*", "")


def _boxed(text: str) -> list[tuple[int, str]]:
    """(position, content) of every ``\\boxed{...}``, braces balanced."""
    found = []
    for match in _BOXED.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((match.start(), text[match.end() : i - 1]))
    return found


def _single(choice: str, rest: str, valid: set[str]) -> str:
    """``choice`` as a letter, or ``_INVALID`` if it is no option or a second option follows."""
    letter = _letter(choice)
    if letter not in valid:
        return _INVALID
    also = _ALSO.match(rest)
    if also is not None and _letter(also.group("choice")) in valid:
        return _INVALID
    return letter


def _explicit(text: str, valid: set[str]) -> list[tuple[int, str]]:
    answers = []
    for pos, content in _boxed(text):
        m = _BOX_CONTENT.fullmatch(content)
        if m is None:
            answers.append((pos, _INVALID))
        else:
            answers.append((pos, _single(m.group("p") or m.group("l"), m.group("rest"), valid)))
    for m in _MARKER.finditer(text):
        letter = _letter(m.group("choice"))
        if letter == "I" and "I" not in valid:
            continue  # "the answer: I think..." is the pronoun, not an option
        answers.append((m.start("choice"), _single(m.group("choice"), text[m.end() :], valid)))
    return answers


def _trailing(text: str, valid: set[str]) -> str | None:
    stripped = text.strip()
    last_line = stripped.rsplit("\n", 1)[-1].strip(" \t.:;!'\"()[]")
    if len(last_line) == 1 and last_line.isalpha():
        return last_line.upper() if last_line.upper() in valid else None
    for pattern in (_TRAILING_PAREN, _TRAILING_CONCLUSION):
        m = pattern.search(stripped)
        if m is None:
            continue
        letter = _letter(m.group("choice"))
        before = _BEFORE_OR.search(stripped[: m.start("choice")].rstrip("( "))
        if before is not None and _letter(before.group("choice")) in valid:
            return None  # "A or B)"
        return letter if letter in valid else None
    return None


def extract_choice(text: str, letters: Iterable[str]) -> str | None:
    """The option letter (uppercase) that ``text`` answers with, or None if it names none or
    several. ``letters`` are the valid options, e.g. ``"ABCD"``."""
    valid = {letter.strip().upper() for letter in letters}
    cleaned = _clean(text)
    answers = _explicit(cleaned, valid)
    if answers:
        _, letter = max(answers)
        return letter or None
    return _trailing(cleaned, valid)
