"""``docs/reference/api.md``: the public Python API as plain markdown, from the docstrings.

Written into the page (not left to mkdocstrings at build time), so the page reads the same on
GitHub as on the site. The code is read statically by griffe (mkdocstrings' own loader): no
module is imported, so no optional dependency (torch, TRL) is needed to write or check it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "reference" / "api.md"

SECTIONS = [
    ("Starting a config's servers", "rollgym.serving"),
    ("Collecting inside a trainer", "rollgym.trainer"),
    ("Environments", "rollgym.server.resources"),
    ("Environments", "rollgym.server.gymnasium"),
    ("Agents", "rollgym.server.agent"),
    ("Trainer samples", "rollgym.integrations.samples"),
    ("Run health", "rollgym.health"),
    ("Records", "rollgym.collect.records"),
    ("Trainer bridges", "rollgym.integrations.trl"),
    ("Trainer bridges", "rollgym.integrations.weights"),
]

INTRO = """# Python API

The public Python API, from its docstrings. The guides show each in use:
[the trainer API](../integrations/trainer-api.md), [write an environment or an
agent](../guides/environments.md), [run health](../guides/health.md), [trainer
integrations](../integrations/index.md).

`import rollgym` gives the entry points: {names}.
"""


def text(doc: str) -> str:
    """A docstring as markdown: reST's ``code`` becomes `code`."""
    return re.sub(r"``(.+?)``", r"`\1`", doc.strip(), flags=re.DOTALL)


def api_page(header: str) -> str:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    top = loader.load("rollgym")
    assert isinstance(top, griffe.Module)
    exported = ", ".join(f"`rollgym.{n}`" for n in sorted(top.exports or []) if n != "__version__")
    out = [header, INTRO.format(names=exported)]
    last = ""
    for title, path in SECTIONS:
        module = loader.load(path)
        if title != last:
            out.append(f"\n## {title}\n")
            last = title
        out.append(f"\n### `{path}`\n\n")
        if module.docstring:
            out.append(text(module.docstring.value) + "\n")
        for member in _public(module):
            out.append(_member(member))
    return "".join(out)


def _public(module: Any) -> list[Any]:
    """The module's own public names: its ``__all__`` (names it re-exports are documented
    where they are defined), else every public class and function defined in it."""
    names = list(module.exports) if module.exports else list(module.members)
    found = []
    for name in names:
        member = module.members.get(name)
        if member is None or member.is_alias or name.startswith("_"):
            continue
        if member.kind.value in ("class", "function"):
            found.append(member)
    return found


def _member(obj: Any) -> str:
    kind = "class" if obj.kind.value == "class" else "def"
    lines = [f"\n#### `{obj.name}`\n\n`{kind} {obj.signature() or obj.name}`\n\n"]
    if obj.docstring:
        lines.append(text(obj.docstring.value) + "\n")
    if obj.kind.value == "class":
        methods = []
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or member.docstring is None:
                continue
            if member.kind.value == "function" or "property" in member.labels:
                what = f"{name}" if "property" in member.labels else member.signature()
                summary = text(member.docstring.value).split("\n\n")[0]
                methods.append(f"- `{what}`: {' '.join(summary.split())}\n")
        if methods:
            lines.append("\n" + "".join(methods))
    return "".join(lines)
