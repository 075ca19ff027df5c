"""Import cycles among a package's modules: ``python3 scripts/import_cycles.py src/rollgym [--lazy]``.

Module-level imports by default; ``--lazy`` adds the imports inside functions too (a lazy import
still ties two modules together). Prints the module and edge counts and every strongly
connected group of two or more modules.
"""

import ast
import pathlib
import sys

root = pathlib.Path(sys.argv[1])
mods = {}
for p in root.rglob("*.py"):
    rel = p.relative_to(root.parent).with_suffix("")
    name = ".".join(rel.parts)
    if name.endswith(".__init__"):
        name = name[:-9]
    mods[name] = p
graph = {m: set() for m in mods}
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    for node in ast.walk(tree) if "--lazy" in sys.argv else tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for t in targets:
            if t in mods and t != m:
                graph[m].add(t)
# Tarjan SCC
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def sc(v):
    idx[v] = low[v] = c[0]
    c[0] += 1
    st.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in idx:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            out.append(sorted(comp))


for v in graph:
    if v not in idx:
        sc(v)
print(
    f"{len(mods)} modules, {sum(map(len, graph.values()))} import edges, {len(out)} cycles (strongly connected groups)"
)
for comp in out:
    print("  ", " <-> ".join(comp))
