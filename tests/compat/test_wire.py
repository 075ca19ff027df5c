"""The wire vocabulary lives in ``rollgym.wire`` alone: no other module spells a wire name."""

from __future__ import annotations

import ast
from pathlib import Path

from rollgym import wire

SRC = Path(__file__).resolve().parents[2] / "src" / "rollgym"
NAMES = {
    wire.HEADER_ROLLOUT,
    wire.SESSION_HEADER,
    wire.SESSION_COOKIE,
    wire.NG_TASK_INDEX,
    wire.NG_ROLLOUT_INDEX,
}


def _spelt(path: Path) -> set[str]:
    """The wire names ``path`` has as string constants of its own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES
    }


def test_no_module_but_wire_spells_a_wire_name() -> None:
    spelt = {
        str(path.relative_to(SRC)): names
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "wire.py" and (names := _spelt(path))
    }
    assert spelt == {}


def test_the_session_cookie_names_the_session() -> None:
    assert wire.session_cookie("ab12").startswith(f"{wire.SESSION_COOKIE}=ab12;")
