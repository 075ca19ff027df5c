"""The run directory's file names are spelt in one module (``collect/layout.py``), and its
ledger is read by one reader, tolerant of a torn last line or strict about every line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollgym.collect.layout import RunDir, Tolerance, read_ledger
from rollgym.errors import InputError

SRC = Path(__file__).resolve().parents[2] / "src" / "rollgym"
NAMES = {name for name in RunDir.OWN_FILES if "." in name}


def test_no_module_but_the_layout_spells_a_run_file_name() -> None:
    spelt = []
    for path in SRC.rglob("*.py"):
        if path.name == "layout.py" and path.parent.name == "collect":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                spelt.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value}")
    assert not spelt, "\n".join(spelt)


def test_a_reader_skips_a_torn_line_the_ledger_names_it(tmp_path: Path) -> None:
    files = RunDir(tmp_path)
    files.rollouts.write_bytes(
        b'{"task_index": 0, "rollout_index": 0, "reward": 1.0}\n\n'
        b'{"task_index": 0, "rollout_index": 1, "reward": 0.0}\n{"task_index": 1, "rol'
    )
    got = list(files.successes())
    assert [g.key for g in got] == [(0, 0), (0, 1)]
    assert files.rollouts.read_bytes()[got[1].offset :].startswith(
        b'{"task_index": 0, "rollout_index": 1'
    )
    with pytest.raises(InputError, match=r"rollouts.jsonl:4: corrupt ledger record"):
        list(read_ledger(files.rollouts, Tolerance.STRICT))
    assert list(files.failed()) == []  # no failures.jsonl: nothing to read
