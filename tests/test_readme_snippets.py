"""The README's and the docs pages' copy-paste snippets are files the tests run: a code block
right after a line ``<!-- snippet: PATH -->`` must be PATH's text exactly, so the docs cannot
drift from code that is executed (each PATH is run by its own test, named in the comment's
file). tests/docs/test_blocks.py checks the other markers (every block must have one)."""

from __future__ import annotations

import re

import pytest

from tests.docs.blocks import ROOT, pages

SNIPPET = re.compile(r"<!-- snippet: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)```\n", re.DOTALL)


def snippets() -> list[tuple[str, str, str]]:
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        where = str(page.relative_to(ROOT))
        found += [(where, m["path"], m["body"]) for m in SNIPPET.finditer(text)]
    return found


def test_the_docs_have_snippets_and_every_marker_is_followed_by_a_block() -> None:
    marker = re.compile(r"^<!-- snippet: ", re.MULTILINE)
    markers = sum(len(marker.findall(p.read_text(encoding="utf-8"))) for p in pages())
    assert markers == len(snippets()) > 0


@pytest.mark.parametrize(
    ("page", "path", "body"), snippets(), ids=[f"{w}:{p}" for w, p, _ in snippets()]
)
def test_a_snippet_is_its_file_exactly(page: str, path: str, body: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{page} names {path}, which does not exist"
    assert body == file.read_text(encoding="utf-8"), f"{page}'s snippet differs from {path}"
