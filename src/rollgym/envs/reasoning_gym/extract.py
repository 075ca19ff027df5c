"""The answer in a reply, by reasoning-gym's convention: the text of the last
``<answer>...</answer>`` block, stripped (``reasoning_gym.utils.extract_answer``).

reasoning-gym finds it with the regex ``<answer>\\s?(.*?)\\s?</answer>``; on a reply of many
``<answer>`` openings and no closing one that regex scans the rest of the text from every
opening (quadratic: minutes on a few MB). ``answer_block`` finds the same block in one pass:
the regex's matches are, left to right, an opening and the first closing after it, the next
match starting after that closing; its group, stripped, is the text between them stripped.
The tests check the two agree on generated replies.

An ``<answer>`` inside an ``<answer>`` is text of the outer block (as for the regex), so
``<answer><answer>4</answer></answer>`` gives ``<answer>4``, which is not ``4``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

OPEN, CLOSE = "<answer>", "</answer>"
BOXED_OPEN = "\\boxed{"

Extraction = Literal["answer_tag", "nemo_gym"]

_NOTHING = re.compile(r"[\s\[\](){}'\",]*")


def says_nothing(answer: str, reference: Any) -> bool:
    """Whether ``answer`` says nothing (only whitespace, brackets, quotes and commas: ``""``,
    ``[]``, ``{[]}``) where the entry's ``reference`` says something or there is none. Such an
    answer earns 0 unscored: some scorers pay any answer that parses (the server's docstring
    names them); an empty reference (ab's empty output) leaves the answer to the scorer."""
    if not _NOTHING.fullmatch(answer):
        return False
    return not (isinstance(reference, str) and _NOTHING.fullmatch(reference))


def answer_block(text: str) -> str | None:
    """The stripped text of the last ``<answer>`` block of ``text``; None if there is none."""
    found: tuple[int, int] | None = None
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            break  # no later opening has a closing after it either
        found = (start + len(OPEN), end)
        pos = end + len(CLOSE)
    return None if found is None else text[found[0] : found[1]].strip()


def extract(text: str, how: Extraction) -> str | None:
    """The answer of a reply: its ``<answer>`` block; with ``nemo_gym``, as NeMo Gym's
    reasoning_gym server reads it when there is none: the first ``\\boxed{...}`` (without
    nested braces), else the whole reply stripped (None only for an empty reply)."""
    block = answer_block(text)
    if block is not None or how == "answer_tag":
        return block
    boxed = first_boxed(text)
    if boxed is not None:
        return boxed.strip()
    return text.strip() or None


def first_boxed(text: str) -> str | None:
    """What ``re.search(r"\\boxed\\{([^}]+)\\}")`` finds, in one pass: that
    regex scans the rest of the text from every opening, quadratic on ``"\\boxed{" * n``."""
    pos = 0
    while (start := text.find(BOXED_OPEN, pos)) >= 0:
        inner = start + len(BOXED_OPEN)
        end = text.find("}", inner)
        if end < 0:
            return None  # no "}" after this opening: none after a later one either
        if end > inner:
            return text[inner:end]
        pos = inner  # "\boxed{}": empty, the next opening may hold one
    return None
