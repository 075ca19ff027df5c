"""``docs/reference/api.md``: the public Python API as plain markdown, from the docstrings.

The API is ``rollgym.__all__`` (each name under its home module, ``PUBLIC``) and a few modules
documented by their path (``MODULES``); the page documents exactly that.

Written into the page (not left to mkdocstrings at build time), so the page reads the same on
GitHub as on the site. The code is read statically by griffe (mkdocstrings' own loader): no
module is imported, so no optional dependency (torch, TRL) is needed to write or check it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "reference" / "api.md"

PUBLIC = [
    ("Starting a config's servers", "rollgym.serving"),
    ("Collecting inside a trainer", "rollgym.trainer"),
    ("Records", "rollgym.collect.records"),
    ("Environments", "rollgym.server.resources"),
    ("Environments", "rollgym.server.gymnasium"),
    ("Agents", "rollgym.server.agent"),
    ("Errors", "rollgym.errors"),
]
"""The homes of ``rollgym.__all__``'s names (``_HOMES`` in ``src/rollgym/__init__.py``), in page
order: each is its module's docstring, then the names of ``__all__`` that live there."""

MODULES = [
    ("Trainer samples", "rollgym.integrations.samples"),
    ("Run health", "rollgym.health"),
    ("Trainer bridges", "rollgym.integrations.trl"),
    ("Trainer bridges", "rollgym.integrations.weights"),
]
"""Modules documented by their path, not in ``rollgym.__all__``: they need an extra (TRL) or
serve one task. Each is its docstring and its own public names."""

INTRO = """# Python API

The public Python API, from its docstrings. The guides show each in use:
[the trainer API](../integrations/trainer-api.md), [write an environment or an
agent](../guides/environments.md), [run health](../guides/health.md), [trainer
integrations](../integrations/index.md).

`import rollgym` gives exactly these names (`rollgym.__all__`, besides `rollgym.__version__`),
each documented below under the module it also comes from: {names}.

Modules documented by their path, below them: {modules}.
"""


def text(doc: str) -> str:
    """A docstring as markdown: reST's ``code`` becomes `code`."""
    return re.sub(r"``(.+?)``", r"`\1`", doc.strip(), flags=re.DOTALL)


def api_page(header: str) -> str:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    top = loader.load("rollgym")
    assert isinstance(top, griffe.Module)
    by_home = _public_names(top)
    names = ", ".join(f"`rollgym.{n}`" for home in by_home.values() for n in home)
    modules = ", ".join(f"`{path}`" for _, path in MODULES)
    out = [header, INTRO.format(names=names, modules=modules)]
    last = ""
    for title, path in PUBLIC + MODULES:
        module = loader.load(path)
        if title != last:
            out.append(f"\n## {title}\n")
            last = title
        out.append(f"\n### `{path}`\n\n")
        if module.docstring:
            out.append(text(module.docstring.value) + "\n")
        members = [top.members[n].final_target for n in by_home[path]] if path in by_home else None
        for member in members if members is not None else _public(module):
            out.append(_member(member))
    return "".join(out)


def _public_names(top: Any) -> dict[str, list[str]]:
    """``rollgym.__all__`` by home, in ``PUBLIC``'s order: each name's home is where the
    package imports it from (``_HOMES``), which must be what its type-checking import says."""
    homes = ast.literal_eval(str(top.members["_HOMES"].value))
    exported = [n for n in top.exports or [] if n != "__version__"]
    if sorted(exported) != sorted(homes):
        raise ValueError("rollgym.__all__ and _HOMES name other names")
    by_home: dict[str, list[str]] = {path: [] for _, path in PUBLIC}
    for name in sorted(exported, key=lambda n: (n[0].islower(), n)):
        imported = top.members[name].target_path.rpartition(".")[0]
        if imported != homes[name]:
            raise ValueError(f"{name}: imported from {imported}, _HOMES says {homes[name]}")
        if homes[name] not in by_home:
            raise ValueError(f"{name}: its home {homes[name]} is not in PUBLIC")
        by_home[homes[name]].append(name)
    if not all(by_home.values()):
        raise ValueError("a module of PUBLIC is the home of no name of rollgym.__all__")
    return by_home


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
