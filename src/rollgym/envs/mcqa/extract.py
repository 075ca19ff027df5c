"""Find which option letter a free-text answer chose.

``extract_choice`` reads the *last* explicit answer (``\\boxed{B}``, ``Answer: B``, ``the answer
is (B)``, ``**Answer:** B``, ``I'd go with B``); without one it accepts only a reply that ends
unmistakably (a lone letter, ``... B)``, ``Therefore, B.``). An answer naming two options
(``A or C``, ``\\boxed{A, C}``) or a letter outside the options is no answer: None, never a guess.
So is a list of options, however it is written (``A B C D``, one letter per line, ``(A)(B)``,
``\\boxed{A}\\boxed{B}``, ``Answer: A\nAnswer: B``): a policy must not be paid for naming every
option. The separators of a list are not enumerated: after a separator (``A or C``, ``A, C``)
another letter makes a list; otherwise the rest of the reply does when it holds nothing but
option letters, symbols and hedging words (``A · B · C``, ``A or maybe B``, ``A (or B)``,
``A? B?``, ``A\n.\nB``). A word there means the letters are named in an explanation
(``B. (A) and (C) are wrong``, ``B (A is close)``): the answer stands. (A list followed by a
word, ``A B C D ok``, is read as its first letter: it pays only when that letter is right, as
naming it alone would.) A later answer still corrects an earlier one when words come between them
(``Answer: A. Wait, actually the answer is C``).

The text is model output, so every step is linear in its length: braces are matched in one pass
and no pattern backtracks over what it has already read.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

# LaTeX text wrappers inside math: \text{B}, \textbf{(B)}, \mathrm{B} ...
_WRAPPER = re.compile(
    r"\\(?:text|textbf|textrm|textit|textsf|texttt|mathrm|mathbf|mathit|mathsf|mbox)\s*\{([^{}]*)\}"
)
_MATH_DELIMS = re.compile(r"\$+|\\[()\[\]]")
_SPACE_RUN = re.compile(r"\s{2,}")
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
# A second option right after the first: "A or C", "A, C", "A/C", "A and C", "A; C", "A | C"
# (matched at the answer's end only; its two \s* are split by the separator it must match).
_ALSO = re.compile(
    rf"\s*{_SEPARATOR}\s*(?i:(?:option|choice)\s+)?(?P<choice>{_LETTER})",
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
    rf"(?:(?P<choice>{_LETTER})\s*{_SEPARATOR}|(?P<listed>\(\s*[A-Za-z]\s*\)|\b[A-Z]\)?)[.]?)"
    r"\s*(?i:(?:option|choice)\s+)?$"
)
_LONE_LETTER = re.compile(r"[\s.:;!'\"()\[\]*]*(?P<choice>[A-Za-z])[\s.:;!'\"()\[\]*]*")
_MAX_UNWRAP = 16  # nesting of \text{\textbf{...}} unwrapped; deeper is no answer anyone writes

_INVALID = ""  # an explicit answer that names no single valid option

# The pieces of text between an answer and what follows it: a LaTeX command, an escaped
# symbol, a word (letters and digits, any script), a run of white space, or one other character.
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[^\W_]+|\s+|.", re.DOTALL)
# Words that join options into a hedge ("A or maybe B", "A vs B").
_HEDGE_WORDS = frozenset(
    ["or", "and", "nor", "vs", "versus", "maybe", "perhaps", "possibly", "probably", "either",
     "also", "alternatively", "otherwise", "else", "then", "plus"]
)  # fmt: skip
# Words that name an option without joining anything ("Option A is Mercury", "(option B)").
_NAMING_WORDS = frozenset(["option", "options", "choice", "choices", "letter"])
# Words that may stand between two answers of one list ("Answer: A\nAnswer: B").
_ANSWER_WORDS = (
    _HEDGE_WORDS | _NAMING_WORDS | frozenset(["the", "final", "correct", "answer", "is"])
)
# The punctuation that may stand between two answers of one list ("\boxed{A}, \boxed{B}").
_LIST_MARKS = frozenset(".:)]}$,;/&|+")
_TAIL_CHARS = 4_000
"""Characters before a reply's last line searched for the line above it."""
# A lowercase letter is an option where it ends the text or a clause ("answer: a, b").
_LOWER_ENDS = re.compile(r"[ \t]?(?:$|[.,;:!?)\]}])")
_MAX_JOIN_TOKENS = 1_000
"""Tokens looked at after an answer (or between two), which keeps each scan cheap: past them,
an answer is judged on what was seen, and two answers are not one list."""


def _option_at(text: str, start: int, end: int, valid: set[str]) -> str | None:
    """The option letter that the word ``text[start:end]`` is, if it is one: an uppercase
    letter, or a lowercase one in brackets (``(b)``) or ending a clause (``a, b``); a lowercase
    letter before a word is a word ("a planet")."""
    word = text[start:end]
    if len(word) != 1 or not word.isascii() or not word.isalpha():
        return None
    if word.islower() and not (
        (start > 0 and text[start - 1] in "([" and text[end : end + 1] in (")", "]"))
        or _LOWER_ENDS.match(text, end)
    ):
        return None
    return word.upper() if word.upper() in valid else None


def _names_another(text: str, pos: int, valid: set[str]) -> bool:
    """Whether another option letter follows an answer that ends at ``pos`` as part of a list
    or hedge: right after a separator ("A or C", "A, C", "A/C"), or anywhere in what is left of
    the text when that is nothing but option letters, symbols and hedging words ("A · B · C",
    "A or maybe B", "A (or B)", "A? B? C?"). A word that is none of these means the letters
    are mentioned in an explanation ("A. (B) and (C) are wrong", "A (B is close)"): not a list.
    One pass over the text after ``pos``."""
    also = _ALSO.match(text, pos)
    if also is not None and _letter(also.group("choice")) in valid:
        return True
    other = False
    for n, m in enumerate(_TOKEN.finditer(text, pos)):
        if n == _MAX_JOIN_TOKENS:
            return other  # filler past any reply's: judged on what was seen
        token = m.group()
        if not token[0].isalnum():
            continue
        if _option_at(text, m.start(), m.end(), valid) is not None:
            other = True
        elif token.lower() not in _HEDGE_WORDS and token.lower() not in _NAMING_WORDS:
            return False
    return other


def _only_joins(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]``, between two answers, joins them into one list: white space,
    LaTeX commands (``\\quad``), invisible characters, the punctuation of a list
    (``.:)]}$,;/&|+``) and answering or hedging words only. Anything else (words, a rule, an
    emoji) stands between an answer and the one that corrects it."""
    for n, m in enumerate(_TOKEN.finditer(text, start, end)):
        if n == _MAX_JOIN_TOKENS:
            return False  # a long stretch between them: a correction, not one list
        token = m.group()
        if token[0].isalnum():
            joins = token.lower() in _ANSWER_WORDS
        else:
            joins = token.isspace() or token[0] == "\\" or token in _LIST_MARKS
            joins = joins or unicodedata.category(token[0]) == "Cf"
        if not joins:
            return False
    return True


def _letter(token: str) -> str:
    return token.strip("()[] \t").upper()


def _clean(text: str) -> str:
    previous = None
    for _ in range(_MAX_UNWRAP):  # each pass unwraps one level; bounded, as the text is hostile
        if previous == text:
            break
        previous, text = text, _WRAPPER.sub(r"\1", text)
    text = _MATH_DELIMS.sub(" ", text).replace("*", "")
    # One white-space character per run (a newline if the run holds one): no pattern then
    # meets a long run between two optional spaces, which made readers quadratic ("A)" and
    # 100,000 spaces after an answer took 185 s); no answer depends on how many spaces there are.
    return _SPACE_RUN.sub(_one_space, text)


def _one_space(m: re.Match[str]) -> str:
    return "\n" if "\n" in m.group() else " "


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
    if _names_another(text, pos, valid):
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
        if not _only_joins(text, prev_end, start):
            break  # words between them: a later answer corrects an earlier one
        if prev_letter != letter:
            return _INVALID
        start = prev_start
    return letter


def _trailing(text: str, valid: set[str]) -> str | None:
    stripped = text.strip()
    head, _, last = stripped.rpartition("\n")
    last_line = last.strip(" \t.:;!'\"()[]")
    if len(last_line) == 1 and last_line.isalpha():
        previous = _last_worded_line(head)
        if previous:
            before = _LONE_LETTER.fullmatch(previous)
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


def _last_worded_line(head: str) -> str | None:
    """The last line of ``head`` holding a letter or digit (lines of white space, symbols or
    invisible characters between list items skipped), among its last ``_TAIL_CHARS``."""
    for line in reversed(head[-_TAIL_CHARS:].split("\n")):
        if any(c.isalnum() for c in line):
            return "".join(c for c in line if c.isalnum() or c in "().:[] \t")
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
