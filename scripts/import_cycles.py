"""Import cycles among rollgym's modules: ``python scripts/import_cycles.py [--parts] [src/rollgym]``.

Counts top-level and lazy imports (a lazy import still ties two modules together), not those
under ``TYPE_CHECKING``. Prints the module and edge counts and every strongly connected group of
two or more modules; with ``--parts``, the same for the parts (``rollgym.<part>``: a package or
a top-level module), counting every import, as ``tests/test_layers.py`` does. Exits 1 when there
is a cycle (``make lint`` runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from import_graph import Import, cycles, imports, modules  # beside this script

args = [a for a in sys.argv[1:] if a != "--parts"]
root = Path(args[0] if args else Path(__file__).parents[1] / "src" / "rollgym")
if "--parts" in sys.argv:

    def part(name: str) -> str:
        return name.split(".")[1] if "." in name else "__init__"

    edges = [
        Import(part(e.source), part(e.target), e.path, e.line, e.kind)
        for e in imports(root)
        if part(e.source) != part(e.target)
    ]
    names = {part(m) for m in modules(root)}
    what = "parts"
else:
    edges = [edge for edge in imports(root) if edge.kind != "typing"]
    names = set(modules(root))
    what = "modules"
groups = cycles(edges)
pairs = {(edge.source, edge.target) for edge in edges}
print(f"{len(names)} {what}, {len(pairs)} import edges, {len(groups)} cycles")
for group in groups:
    print("  ", " <-> ".join(group))
sys.exit(1 if groups else 0)
