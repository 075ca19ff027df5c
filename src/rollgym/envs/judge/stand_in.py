"""A deterministic stand-in judge for demos, tests and ``rollgym check``. It is NOT a language
model: it reads the GOLD and CANDIDATE sections of ``JudgeEnv``'s default equivalence prompt and
says ``[[A=B]]`` when their normalized texts (case, spaces, punctuation, a ``\\boxed{}``) match,
else ``[[A!=B]]``. A quoted answer (``verdict.quoted``) is read as one block, so nothing in it
can move the sections. Point ``judge`` at an ``openai_proxy`` server for real judging."""

from __future__ import annotations

import re
from typing import Any

from rollgym.envs.judge.verdict import QUOTE
from rollgym.models.scripted import build_response
from rollgym.server.endpoint import Call
from rollgym.server.model import ModelServer

_SECTIONS = re.compile(r"GOLD:\n(?P<gold>.*?)\n\nCANDIDATE:\n(?P<candidate>.*)\Z", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def normalize(text: str) -> str:
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    return re.sub(r"[\W_]+", "", text.lower())


def _same(gold: str, candidate: str, quotes: list[str]) -> bool:
    def text(section: str) -> str:
        return re.sub(r"\x00(\d+)\x00", lambda m: quotes[int(m[1])], section)

    return normalize(text(gold)) == normalize(text(candidate))


class StandInJudge(ModelServer):
    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        items = params.get("input")
        prompt = ""
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("role") == "user":
                prompt = str(item.get("content", ""))
        quotes: list[str] = []

        def hold(m: re.Match[str]) -> str:
            quotes.append(m["body"])
            return f"\x00{len(quotes) - 1}\x00"

        found = _SECTIONS.search(QUOTE.sub(hold, prompt))
        if found is None:
            text = "I can only compare a GOLD and a CANDIDATE section."
        elif _same(found["gold"], found["candidate"], quotes):
            text = "They state the same answer. [[A=B]]"
        else:
            text = "They state different answers. [[A!=B]]"
        return build_response(params, {"say": text})
