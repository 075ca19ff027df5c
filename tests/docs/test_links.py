"""Every relative link of the README and of the docs pages resolves: to a file of the checkout
(the README's) or of docs/ (a page's), and a ``#anchor`` to a heading of the page it names."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.blocks import ROOT, pages

LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCED = re.compile(r"^```.*?^```[ \t]*$", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """Python-Markdown's toc slug: what MkDocs makes a heading's anchor."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"[^\w\s-]", "", text.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)}


def links(page: Path) -> list[str]:
    text = CODE.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    return [m["target"] for m in LINK.finditer(text)]


def test_every_relative_link_resolves() -> None:
    broken = []
    checked = 0
    for page in pages():
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL: not ours to check offline
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 20
    assert not broken, "\n".join(broken)


def test_the_readme_links_into_the_docs() -> None:
    targets = links(ROOT / "README.md")
    assert any(t.startswith("docs/") for t in targets)
