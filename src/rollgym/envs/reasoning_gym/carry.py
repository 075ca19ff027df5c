"""A reasoning-gym entry carried in a JSON task row, and restored exactly for its scorer.

Entries are Python values: most of them lose their types through JSON (a tuple becomes a list, an
``int``-keyed dict gets ``str`` keys), and some scorers then give a wrong score (arc_agi and rearc
compare the answer's board, a tuple of tuples, with the entry's: after JSON the reference answer
scores 0.05). So a row carries the entry as plain JSON (``question``, ``answer``, ``metadata``) plus
``restore``, the few type changes to undo, each ``[path, kind]``:

- ``tuple``: the list at ``path`` was a tuple;
- ``tuples``: the list at ``path`` and every list inside it were tuples (one patch for a board);
- ``int_keys``: the dict at ``path`` had ``int`` keys.

``path`` is a list of dict keys (strings) and list indices (ints) from the entry. A patch is
listed after every patch inside it, so applying them in order rebuilds the innermost values
first. numpy scalars become the Python number or string they equal (their scorers compare by
value). A value JSON cannot hold at all (a float NaN, a set, an object) is refused with
``NotCarried`` naming its path, never carried wrong.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

Path = list[str | int]
Patch = list[Any]  # [path, kind]: a JSON array in the row

KINDS = ("tuple", "tuples", "int_keys")


class NotCarried(ValueError):
    """An entry holds a value a JSON row cannot carry exactly."""


def carry(entry: dict[str, Any]) -> tuple[dict[str, Any], list[Patch]]:
    """``entry`` as plain JSON values, and the patches that restore it."""
    patches: list[Patch] = []
    plain = _plain(entry, [], patches)
    return plain, patches


def restore(plain: dict[str, Any], patches: list[Any]) -> dict[str, Any]:
    """The entry ``carry`` made ``plain`` and ``patches`` from; ``ValueError`` naming the
    patch if one does not fit the value it names."""
    entry: dict[str, Any] = _copy(plain)
    if not isinstance(patches, list):
        raise ValueError("'restore' must be a list of [path, kind] patches")
    for i, patch in enumerate(patches):
        if not (isinstance(patch, list) and len(patch) == 2 and isinstance(patch[0], list)):
            raise ValueError(f"restore[{i}]: expected [path, kind], got {patch!r:.80}")
        path, kind = patch
        if kind not in KINDS or not path:
            raise ValueError(f"restore[{i}]: kind must be one of {KINDS}, path non-empty")
        parent = _at(entry, path[:-1], i)
        key = path[-1]
        value = _get(parent, key, i)
        if kind == "int_keys":
            if not isinstance(value, dict):
                raise ValueError(f"restore[{i}]: {path} is not an object")
            try:
                new: Any = {int(k): v for k, v in value.items()}
            except ValueError:
                raise ValueError(f"restore[{i}]: {path} has a key that is not an int") from None
        else:
            if not isinstance(value, list):
                raise ValueError(f"restore[{i}]: {path} is not a list")
            new = _deep_tuple(value) if kind == "tuples" else tuple(value)
        _set(parent, key, new, i)
    return entry


def _plain(value: Any, path: Path, patches: list[Patch]) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)  # numpy.str_ too
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return int(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise NotCarried(f"{_where(path)}: {value!r} has no JSON form")
        return float(value)
    if isinstance(value, (list, tuple)):
        items = [_plain(v, [*path, i], patches) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            if _all_tuples(value):
                # One patch for the whole nest: drop the ones just made inside it.
                patches[:] = [p for p in patches if p[0][: len(path)] != path]
                patches.append([list(path), "tuples"])
            else:
                patches.append([list(path), "tuple"])
        return items
    if isinstance(value, dict):
        keys = list(value)
        if all(isinstance(k, str) for k in keys):
            return {k: _plain(v, [*path, k], patches) for k, v in value.items()}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
            out = {str(k): _plain(v, [*path, str(k)], patches) for k, v in value.items()}
            patches.append([list(path), "int_keys"])
            return out
        raise NotCarried(f"{_where(path)}: a dict with keys {sorted(map(repr, keys))[:4]}")
    raise NotCarried(f"{_where(path)}: a {type(value).__name__} has no JSON form")


def _all_tuples(value: Any) -> bool:
    """Whether every sequence in ``value`` (itself included) is a tuple and no dict is."""
    if isinstance(value, (list, dict)):
        return False
    if isinstance(value, tuple):
        return all(_all_tuples(v) for v in value)
    return True


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _at(entry: Any, path: list[Any], i: int) -> Any:
    node = entry
    for key in path:
        node = _get(node, key, i)
    return node


def _get(node: Any, key: Any, i: int) -> Any:
    if isinstance(node, dict) and isinstance(key, str) and key in node:
        return node[key]
    if isinstance(node, (list, tuple)) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    raise ValueError(f"restore[{i}]: no {key!r} in a {type(node).__name__}")


def _set(node: Any, key: Any, value: Any, i: int) -> None:
    if isinstance(node, tuple):
        raise ValueError(f"restore[{i}]: its parent was restored first (patches out of order)")
    node[key] = value


def _where(path: Path) -> str:
    return "entry" + "".join(f"[{k!r}]" for k in path)
