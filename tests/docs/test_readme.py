"""The README stays a landing page: it opens with the two commands CI and a newcomer rely on,
and it stays short (the reference lives in docs/)."""

from __future__ import annotations

from tests.docs.blocks import ROOT, blocks


def test_the_readme_opens_with_make_demo_and_make_test() -> None:
    first = blocks(ROOT / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.body.splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move reference material into docs/"
