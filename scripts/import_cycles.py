"""Import cycles among rollgym's modules: ``python scripts/import_cycles.py [src/rollgym]``.

Counts top-level and lazy imports (a lazy import still ties two modules together), not those
under ``TYPE_CHECKING``. Prints the module and edge counts and every strongly connected group of
two or more modules; exits 1 when there is one (``make lint`` runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from import_graph import cycles, imports, modules  # beside this script

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "src" / "rollgym")
edges = [edge for edge in imports(root) if edge.kind != "typing"]
groups = cycles(edges)
pairs = {(edge.source, edge.target) for edge in edges}
print(f"{len(modules(root))} modules, {len(pairs)} import edges, {len(groups)} cycles")
for group in groups:
    print("  ", " <-> ".join(group))
sys.exit(1 if groups else 0)
