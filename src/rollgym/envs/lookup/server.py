"""``LookupEnv``: the model must call ``lookup`` and answer from what it returns.

The registry (``knowledge.py``) is fictional, so a right answer without a lookup is a guess;
``verify`` pays only an answer that contains the expected value *and* came from a rollout whose
lookups returned it (a lookup of a key that does not exist, or of another entry, is not a
source: ``reason`` ``not_looked_up``; a comparison needs the entries of all its candidates).
``tool_called`` (a lookup found an entry) is reported as a metric, and ``aggregate_metrics``
turns it into the run's tool-call rate.

Answers are model output, and a policy will try the cheap way to "contain" the value: list many
of them. An answer that also names another registry value of the same kind as the expected one
(another town's population, another mayor) scores 0 with ``reason`` ``several_candidates``;
so does one naming values of ``LIST_FIELDS`` other fields without concluding on the asked one
(an entry's every field at once would pay for whichever was asked), while one that explains
itself with one or two, or quotes the entry and then concludes, still scores.
A comparison names its candidates in the question ("Velmora or Serrowby?"); there an answer must
choose: the first candidate it names is its choice, and the others may appear only as what it
is set against ("... than Serrowby", "compared to Serrowby", "not Serrowby", "while Serrowby
has ..."). So "Velmora or Serrowby" and "either Serrowby or Velmora" are no answer, and no text
is paid for both choices. The price is that an answer that names the other candidate first
("Serrowby has 3,958, so Velmora has more") also scores 0, with that reason.
A key longer than any key
(``MAX_KEY_CHARS``) is refused without being echoed back.
"""

from __future__ import annotations

import difflib
import re
from functools import cache
from typing import Any

from rollgym.envs.lookup.knowledge import ENTRIES, canonical_key
from rollgym.envs.rows import content_texts, mean_field, prompt_items
from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool

# "48,213" and "48213" are the same number; commas between digit groups are dropped.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
# What a comparison's other candidate may follow: it is then what the choice is set against
# ("than in Serrowby", "compared to Serrowby", "not Serrowby", "whereas Serrowby"). Not "or",
# "vs", "and": those list the candidates without choosing.
_AGAINST = re.compile(
    r"(?<![0-9a-z])(?:than|compared (?:to|with)|not|while|whereas|unlike|rather than)"
    r" (?:(?:in|at|of|for|the|does|do|is) )*$"
)
MAX_KEY_CHARS = 100
"""Longer than every key: a longer one is refused before it is looked up, kept or echoed."""


def normalize(text: str) -> str:
    """Casefolded text with thousands separators and runs of whitespace collapsed."""
    return " ".join(_THOUSANDS.sub("", text).split()).casefold()


def contains_answer(text: str, expected: str) -> bool:
    """Whether ``expected`` occurs in ``text`` as a whole token (``482`` is not in ``48213``)."""
    return _contains(normalize(text), normalize(expected))


def _token(needle: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![0-9a-z]){re.escape(needle)}(?![0-9a-z])")


def _contains(normalized_text: str, needle: str) -> bool:
    return bool(needle) and _token(needle).search(normalized_text) is not None


@cache
def _values_by_field() -> dict[tuple[str, str], frozenset[str]]:
    """Every registry value (normalized), by (kind, field): the candidates an answer picks from."""
    out: dict[tuple[str, str], set[str]] = {}
    for entry in ENTRIES.values():
        for field, value in entry.items():
            if field != "kind":
                out.setdefault((entry["kind"], field), set()).add(normalize(str(value)))
    return {k: frozenset(v) for k, v in out.items()}


def _mentions(normalized_text: str, needle: str) -> list[int]:
    """Where ``needle`` starts as a whole token in ``normalized_text``."""
    return [m.start() for m in _token(needle).finditer(normalized_text)] if needle else []


def rival_values(expected: str, question: str) -> tuple[set[str], set[str]]:
    """The registry values of the same kind as ``expected``: those the question does not name
    (an answer naming one beside ``expected`` is a list of guesses), and those it names (the
    other candidates of a comparison)."""
    wanted, asked = normalize(expected), normalize(question)
    rivals: set[str] = set()
    for values in _values_by_field().values():
        if wanted in values:
            rivals |= values
    rivals.discard(wanted)
    named = {v for v in rivals if _contains(asked, v)}
    return rivals - named, named


LIST_FIELDS = 3
"""An answer naming values of this many other fields (besides the one asked, and what the
question names) lists the registry: an entry's every field given at once would pay for
whichever one was asked. It is an answer only if it then concludes: names the asked value
again, after every other one ("The entry says {...}, so the answer is 1608")."""


def lists_fields(normalized_text: str, wanted: str, question: str) -> bool:
    """Whether the text names values of ``LIST_FIELDS`` registry fields other than
    ``wanted``'s (values the question names left out) without concluding on ``wanted``."""
    asked = normalize(question)
    fields: set[str] = set()
    last_other = -1
    for (_kind, field), values in _values_by_field().items():
        if wanted in values:
            continue
        for value in values:
            if _contains(asked, value):
                continue
            if at := _mentions(normalized_text, value):
                fields.add(field)
                last_other = max(last_other, at[-1])
    if len(fields) < LIST_FIELDS:
        return False
    mentions = _mentions(normalized_text, wanted)
    return len(mentions) < 2 or mentions[-1] < last_other


def chooses(normalized_text: str, wanted: str, candidates: set[str]) -> bool:
    """Whether the text picks ``wanted`` among a comparison's ``candidates``: it names
    ``wanted`` before any of them, and the others only as what it is set against."""
    first = _mentions(normalized_text, wanted)
    if not first:
        return False
    for rival in candidates:
        for at in _mentions(normalized_text, rival):
            if at < first[0] or not _AGAINST.search(normalized_text[max(0, at - 40) : at]):
                return False
    return True


def _question(task: dict[str, Any]) -> str:
    """Every text of the row's prompt, one a line."""
    prompt = prompt_items(task)
    if isinstance(prompt, str):
        return prompt
    return "\n".join(
        text
        for item in prompt
        if isinstance(item, dict)
        for text in content_texts(item.get("content"))
    )


class LookupEnv(ResourcesServer):
    """Questions about the fictional Norrowvale registry, answered with the ``lookup`` tool."""

    row_fields = frozenset({"expected_answer"})
    required_row_fields = row_fields
    # verify pays only a rollout whose session made a lookup: /verify alone (a reverify that
    # does not replay) cannot tell; rollgym reverify replays the tool calls first.
    reverify_mode = "unsupported"

    async def seed_session(self, session: Session) -> None:
        session.data["lookups"] = []

    @tool
    async def lookup(self, session: Session, key: str) -> dict[str, Any]:
        """Look up a Norrowvale registry entry by key: a town name or a product code like QX-4471."""
        if len(key) > MAX_KEY_CHARS:
            raise InvalidRequest(
                f"no registry entry for a key of {len(key)} characters (keys are short)",
                status=404,
            )
        canonical = canonical_key(key)
        if canonical is None:
            close = difflib.get_close_matches(key, ENTRIES, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise InvalidRequest(f"no registry entry for key {key!r}{hint}", status=404)
        # Only a found entry is a source an answer may come from; a stateless call has no seed.
        session.data.setdefault("lookups", []).append(canonical)
        return dict(ENTRIES[canonical])

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        expected = task.get("expected_answer")
        if not isinstance(expected, (str, int, float)) or isinstance(expected, bool):
            raise InvalidRequest(
                "lookup task needs 'expected_answer' (a string or number)", status=422
            )
        found = [ENTRIES[k] for k in session.data.get("lookups", ()) if k in ENTRIES]
        scores: dict[str, Any] = {"reward": 0.0, "tool_called": int(bool(found))}
        text, wanted = normalize(output_text(response)), normalize(str(expected))
        if not _contains(text, wanted):
            return scores
        others, candidates = rival_values(str(expected), _question(task))
        if (
            any(_contains(text, v) for v in others)
            or not chooses(text, wanted, candidates)
            or lists_fields(text, wanted, _question(task))
        ):
            return {**scores, "reason": "several_candidates"}
        sourced = {normalize(str(v)) for entry in found for v in entry.values()}
        # A comparison is known only from the entries of all its candidates.
        if not {wanted, *candidates} <= sourced:
            return {**scores, "reason": "not_looked_up"}
        return {**scores, "reward": 1.0}

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return mean_field(rollouts, "tool_called", "tool_call_rate")
