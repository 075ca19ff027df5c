"""rollgym's import graph, read from the source (never by importing it).

    modules(root)            module name -> file, for every module under ``src/rollgym``
    imports(root)            every import of one rollgym module by another: top-level, lazy
                             (inside a function) and ``TYPE_CHECKING`` ones, with file and line
    cycles(edges)            the strongly connected groups of two or more modules

Used by ``scripts/import_cycles.py`` (``make lint``), ``tests/test_layers.py`` and the
architecture page's table (``scripts/gen_reference.py``).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """``source`` imports ``target`` at ``path:line``; ``kind`` is top, lazy or typing."""

    source: str
    target: str
    path: Path
    line: int
    kind: str


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (``src/rollgym``), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _typing_only(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _walk(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """Every import node of ``tree`` with its kind: top (run at import), lazy (inside a
    function), typing (under ``if TYPE_CHECKING``)."""
    out: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, kind))
            elif isinstance(child, ast.If) and _typing_only(child):
                for sub in child.body:
                    visit(ast.Module(body=[sub], type_ignores=[]), "typing")
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), kind)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "typing" if kind == "typing" else "lazy")
            else:
                visit(child, kind)

    visit(tree, "top")
    return out


def imports(root: Path) -> list[Import]:
    """Every import of a module of ``root`` by another, resolved to the module imported
    (``from rollgym.x import y`` is ``rollgym.x.y`` when that is a module, else
    ``rollgym.x``)."""
    mods = modules(root)
    found = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, kind in _walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in mods else base)
            for target in targets:
                # ``import rollgym.a.b`` imports rollgym.a.b; its packages are imported too,
                # but that is Python's doing, not a dependency the code chose.
                while target not in mods and "." in target:
                    target = target.rpartition(".")[0]
                if target in mods and target != name:
                    found.append(Import(name, target, path, node.lineno, kind))
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected groups (two or more modules) of the graph ``edges`` draws."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups
