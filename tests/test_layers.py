"""The import graph is a DAG of layers (DESIGN.md, "Layers and dialects").

A part (``rollgym.<part>``: a package or a top-level module) imports only parts of a lower layer
or of its own layer, counting top-level, lazy and ``TYPE_CHECKING`` imports; within a layer the
parts' imports form no cycle; monitoring (tracing, prometheus) imports only the bottom two
layers; no two modules import each other, lazily or not. A new part must be placed here.
``docs/concepts/architecture.md`` draws its table from ``LAYERS`` (``scripts/gen_reference.py``).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import Import, cycles, imports, modules  # noqa: E402

PACKAGE = ROOT / "src" / "rollgym"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("wire names, errors, credentials, runtime",
     ("wire", "errors", "credentials", "runtime", "extras", "import_path", "lifeline",
      "version")),
    ("config and protocol", ("config", "protocol", "control_token")),
    ("http, and monitoring as leaves", ("http", "tracing", "prometheus")),
    ("servers, processes and containers", ("server", "launch", "chaos", "containers")),
    ("models, agents, environments", ("models", "agents", "envs", "harbor")),
    ("collection and reading a run", ("collect", "health", "report", "reverify", "replay", "audit")),
    ("trainer API, Ray, dialects", ("trainer", "ray", "check", "nemo_gym", "openenv", "dialects")),
    ("integrations", ("integrations", "serving", "testing")),
    ("command line", ("cli", "__main__")),
    ("the package's public names", ("__init__",)),
]  # fmt: skip
"""Bottom first. ``__init__`` is ``rollgym`` itself: its names are imported lazily, and no part
imports it."""

LEAVES = ("tracing", "prometheus")
"""They describe what they watch through the bottom layers only."""


def part(module: str) -> str:
    """``rollgym.collect.rollout`` -> ``collect``; ``rollgym`` -> ``__init__``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def layer_of() -> dict[str, int]:
    return {name: rank for rank, (_, parts) in enumerate(LAYERS) for name in parts}


def _edges() -> list[Import]:
    return [edge for edge in imports(PACKAGE) if part(edge.source) != part(edge.target)]


def _where(edge: Import) -> str:
    return f"{edge.path.relative_to(ROOT)}:{edge.line} ({edge.kind}) imports {edge.target}"


def test_every_part_has_a_layer() -> None:
    ranks = layer_of()
    parts = {part(name) for name in modules(PACKAGE)}
    assert sorted(parts - set(ranks)) == [], "place the new part in LAYERS"
    assert sorted(set(ranks) - parts) == [], "LAYERS names a part that is gone"


def test_no_part_imports_a_layer_above_it() -> None:
    ranks = layer_of()
    upward = [_where(e) for e in _edges() if ranks[part(e.target)] > ranks[part(e.source)]]
    assert upward == []


def test_monitoring_imports_only_the_bottom_layers() -> None:
    ranks = layer_of()
    bottom = ranks["config"]
    wrong = [_where(e) for e in _edges() if part(e.source) in LEAVES
             and ranks[part(e.target)] > bottom]  # fmt: skip
    assert wrong == []


def test_parts_form_no_knot() -> None:
    by_part: dict[tuple[str, str], Import] = {}
    for edge in _edges():
        by_part.setdefault((part(edge.source), part(edge.target)), edge)
    knots = cycles([Import(a, b, e.path, e.line, e.kind) for (a, b), e in by_part.items()])
    shown = defaultdict(list)
    for knot in knots:
        for (a, b), edge in by_part.items():
            if a in knot and b in knot:
                shown[" <-> ".join(knot)].append(f"{a} -> {b}: {_where(edge)}")
    assert dict(shown) == {}


def test_no_module_cycle_even_through_lazy_imports() -> None:
    edges = [edge for edge in imports(PACKAGE) if edge.kind != "typing"]
    assert cycles(edges) == []
