"""The README's copy-paste snippets are files the tests run: a code block right after a line
``<!-- snippet: PATH -->`` must be PATH's text exactly, so the README cannot drift from code
that is executed (each PATH is run by its own test, named in the comment's file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"<!-- snippet: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)```\n", re.DOTALL)


def snippets() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(m["path"], m["body"]) for m in SNIPPET.finditer(text)]


def test_the_readme_has_snippets_and_every_marker_is_followed_by_a_block() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    markers = text.count("<!-- snippet: ")
    assert markers == len(snippets()) > 0


@pytest.mark.parametrize(("path", "body"), snippets(), ids=[p for p, _ in snippets()])
def test_a_snippet_is_its_file_exactly(path: str, body: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"README names {path}, which does not exist"
    assert body == file.read_text(encoding="utf-8"), f"README's snippet differs from {path}"
