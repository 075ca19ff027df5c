"""The code blocks of the README and of every page under docs/, with the marker before each.

Every fenced block must follow (on the line before it, blank lines aside) one marker:

- ``<!-- snippet: PATH -->``: the block is PATH's text exactly (PATH is run by its own test);
- ``<!-- run -->`` (or ``<!-- run: exit=N -->``): tests/docs/test_blocks.py runs it: ``bash``
  blocks with bash, ``python`` blocks with this venv's Python (from stdin, as pasted), in
  order, at the root of a fresh clone per page (``tests/docs/reader.py``); each must leave no
  process running and no untracked file, and write only under ``out/<page name>/``;
- ``<!-- file: NAME -->``: the block is written to NAME in that clone (a config or task file
  a later ``run`` block of the page uses: the reader's own, so it may stay);
- ``<!-- config -->``: the block is a whole rollgym config, validated by ``parse_config``;
- ``<!-- not-run: REASON -->``: shown only; REASON says why it cannot run here (a GPU, vLLM,
  a trainer's venv, a fragment of a record...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- (?P<kind>snippet|run|file|config|not-run)(?::\s*(?P<arg>.*?))?\s*-->")
FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    kind: str | None  # the marker's kind, None when unmarked
    arg: str  # the marker's argument ("" when none)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip("\n") != opening["fence"]:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a code block never closes")
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.fullmatch(before.strip())
        found.append(
            Block(
                page=page,
                line=i + 1,
                lang=opening["lang"],
                body="".join(lines[i + 1 : end]),
                kind=marker["kind"] if marker else None,
                arg=(marker["arg"] or "").strip() if marker else "",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]
