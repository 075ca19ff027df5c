"""An mcqa task row read once into a typed ``MCQATask``; a row that cannot be graded as written
is refused (422) with the field that is wrong, never scored 0 for every answer.

Rows come in two shapes:
- NeMo Gym's: ``options`` a list of one-key objects (``[{"A": "Mercury"}, {"B": "Venus"}]``,
  an option whose text is null is no option), ``grading_mode`` (default
  ``strict_single_letter_boxed``), ``template_metadata.output_regex``.
- rollgym's own: ``options`` a dict letter -> text, or a list of texts lettered A, B, C, ...;
  graded by default in the ``rollgym_lenient`` mode (``extract.extract_choice``). The first
  shape's server refuses these, so no row it grades changes meaning here.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any, Literal, get_args

from rollgym.errors import InvalidRequest

GradingMode = Literal[
    "strict_single_letter_boxed",
    "lenient_boxed",
    "lenient_answer_colon",
    "lenient_answer_colon_md",
    "rollgym_lenient",
]
GRADING_MODES: tuple[str, ...] = get_args(GradingMode)
NEMO_DEFAULT_MODE: GradingMode = "strict_single_letter_boxed"
ROLLGYM_DEFAULT_MODE: GradingMode = "rollgym_lenient"
# NeMo Gym 0.4.0 takes this mode only from its server config: its request model refuses it in a
# row (422). Kept so, for parity; the server option ``grading_mode`` sets it.
_SERVER_ONLY_MODES = ("lenient_answer_colon_md",)


@dataclass(frozen=True)
class MCQATask:
    """What grading reads from a row."""

    options: tuple[tuple[str, str], ...]
    """(letter, text) of every option, in the row's order (uppercase letters)."""
    expected: str
    """The expected letter, uppercase."""
    mode: GradingMode | None
    """The row's ``grading_mode``; None when it names none."""
    default_mode: GradingMode
    """The mode for a row that names none: ``NEMO_DEFAULT_MODE`` for a list of one-key objects,
    ``ROLLGYM_DEFAULT_MODE`` for rollgym's shapes."""
    output_regex: tuple[str, ...] | None
    """``template_metadata.output_regex`` as a tuple of patterns; None when absent."""

    @property
    def letters(self) -> frozenset[str]:
        return frozenset(letter for letter, _ in self.options)


def parse_task(row: dict[str, Any]) -> MCQATask:
    """The grading fields of ``row``; ``InvalidRequest`` (422) naming the field if one is wrong."""
    output_regex = _output_regex(row.get("template_metadata"))
    options, nemo_shape = _options(row.get("options"), regex=output_regex is not None)
    letters = {letter for letter, _ in options}
    expected = row.get("expected_answer")
    gold = expected.strip().upper() if isinstance(expected, str) else ""
    # No answer could match such a row: it is refused, as a failure is not a reward of 0.
    valid = gold in letters if letters else len(gold) == 1 and gold.isalpha()
    if not valid:
        allowed = ", ".join(sorted(letters)) or "a single letter"
        raise _invalid(f"'expected_answer' must be one of {allowed}, got {expected!r}")
    return MCQATask(
        options=tuple(options),
        expected=gold,
        mode=_mode(row),
        default_mode=NEMO_DEFAULT_MODE if nemo_shape else ROLLGYM_DEFAULT_MODE,
        output_regex=output_regex,
    )


def option_letters(options: Any) -> list[str]:
    """The letters of ``options`` in any accepted shape, in order; 422 if it is malformed."""
    return [letter for letter, _ in _options(options, regex=False)[0]]


def _options(raw: Any, *, regex: bool) -> tuple[list[tuple[str, str]], bool]:
    """(letter, text) pairs and whether ``raw`` is a list of one-key objects (or absent where a
    regex stands in)."""
    if (raw is None or raw == []) and regex:
        # A template's regex is trusted when a row lists no options.
        return [], True
    if isinstance(raw, dict) and raw:
        return _lettered(raw.items()), False
    if isinstance(raw, list) and raw and all(isinstance(o, str) for o in raw):
        if len(raw) > 26:
            raise _invalid("'options' as a list of texts takes at most 26 (A to Z)")
        return list(zip(string.ascii_uppercase, raw, strict=False)), False
    if isinstance(raw, list) and raw and all(isinstance(o, dict) for o in raw):
        return _lettered(kv for entry in raw for kv in entry.items()), True
    raise _invalid(
        "'options' must be a list of one-key objects ([{\"A\": text}, ...]), "
        "a dict letter -> text, or a list of texts"
    )


def _lettered(items: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, text in items:
        if not (isinstance(key, str) and len(key) == 1 and key.isalpha()):
            raise _invalid(f"option key {key!r} is not a single letter")
        if text is not None and not isinstance(text, str):
            raise _invalid(f"option {key!r} must be text or null, got {type(text).__name__}")
        letter = key.upper()
        if letter in seen:
            raise _invalid(f"option {letter} is given twice")
        seen.add(letter)
        if text is not None:  # an option whose text is null is not offered
            out.append((letter, text))
    if not out:
        raise _invalid("'options' offers no option with text")
    return out


def _mode(row: dict[str, Any]) -> GradingMode | None:
    if "grading_mode" not in row:
        return None
    mode = row["grading_mode"]
    if mode in _SERVER_ONLY_MODES:
        raise _invalid(
            f"grading_mode {mode!r} is a server option (servers.NAME.options.grading_mode), "
            "not a row field: NeMo Gym 0.4.0 refuses it in a row too"
        )
    if mode not in GRADING_MODES:
        named = ", ".join(m for m in GRADING_MODES if m not in _SERVER_ONLY_MODES)
        raise _invalid(f"'grading_mode' must be one of {named}; got {mode!r}")
    return mode  # type: ignore[no-any-return]


def _output_regex(metadata: Any) -> tuple[str, ...] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise _invalid("'template_metadata' must be an object")
    if "output_regex" not in metadata:
        return None
    patterns = metadata["output_regex"]
    if isinstance(patterns, str):
        patterns = [patterns]
    if not (isinstance(patterns, list) and all(isinstance(p, str) for p in patterns)):
        raise _invalid("'template_metadata.output_regex' must be a pattern or a list of patterns")
    for pattern in patterns:
        try:
            groups = re.compile(pattern, re.IGNORECASE).groups
        except re.error:
            continue  # grading skips (and warns about) a pattern that does not compile
        if groups > 1:
            # NeMo Gym 0.4.0 fails with a 500 once such a pattern matches (it reads a tuple).
            raise _invalid(
                f"output_regex {pattern!r} has {groups} groups; it must capture at most one"
            )
    return tuple(patterns)


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(f"mcqa task: {message}", status=422)
