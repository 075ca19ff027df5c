"""The values that cross the sandbox's boundary, as tagged JSON: one codec for both sides.

The server encodes a probe's arguments (computed before the run) and the launcher decodes
them; the launcher encodes what the solution's calls return and the server decodes that. The
second direction is hostile (the program can write the report itself: ``asserts.py``), so the
decoder refuses what would make the server work for long: deep nesting, integers past
``MAX_BITS`` and keys chosen to share one hash (``HashBudget``, which the server's interpreter
charges too, for every hash table it builds).

Standard library only: the launcher imports this before the sandbox's root hides the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypedDict

MAX_DEPTH = 64
"""How deeply a judged value may nest; deeper is the program's error, not the server's."""
MAX_BITS = 2**20
"""The largest integer a value may hold, or the server's interpreter build, in bits."""
MAX_COLLISIONS = 10**5
"""How many comparisons between distinct keys of one hash the hash tables of one judgement
may make (a set of n such keys takes n * n / 2; 10**5 is a few milliseconds)."""

_KEYS: type[Any] = type({}.keys())
_ITEMS: type[Any] = type({}.items())
_VALUES: type[Any] = type({}.values())
_SEQUENCES: tuple[tuple[Any, str], ...] = (
    (list, "l"),
    (tuple, "t"),
    (set, "S"),
    (frozenset, "F"),
)


class ProbeSpec(TypedDict):
    """One solution-dependent expression of an assert test, and its arguments: the values
    of the names ``__rollgym_arg_N`` in ``expr``, as ``encode`` wrote them (server-computed)."""

    expr: str
    args: dict[str, Any]


class Iterated:
    """What an iterator or generator gave: an iterator over it (``list(x)``, ``sorted(x)``),
    equal to nothing else, as a generator is in Python."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = iter(items)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self._items)


class HashBudget:
    """Every key that goes into a hash table of one judgement (a set, a frozenset, a dict, a
    lookup in one) passes ``admit`` first. Integers, floats and tuples of them can be chosen
    to share one hash (``hash(2**61 + k) == hash(k)``, and a tuple's hash can be inverted),
    and a table of n such keys makes n * n / 2 comparisons; ``admit`` counts the comparisons
    a table would make between distinct keys of one hash (weighted by a tuple's length, as
    comparing two costs that much) and refuses past ``limit``."""

    def __init__(self, limit: int = MAX_COLLISIONS) -> None:
        self.limit = limit
        self.compared = 0
        self._groups: dict[int, list[Any]] = {}

    def admit(self, keys: Iterable[Any]) -> list[Any]:
        """``keys`` as a list, each charged; ``ValueError`` past the budget, ``TypeError``
        for an unhashable key (as the table itself would raise)."""
        out = list(keys)
        for key in out:
            group = self._groups.setdefault(hash(key), [])
            weight = 1 + len(key) if isinstance(key, (tuple, frozenset)) else 1
            for seen in group:
                if seen is key or seen == key:
                    break
                self.compared += weight
            else:
                group.append(key)
            if self.compared > self.limit:
                raise ValueError("values chosen to collide in hash tables")
        return out


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as tagged JSON of plain values. A subclass is read through its base type's
    own methods (a ``Counter`` as a ``dict``, a namedtuple as a ``tuple``, an ``int`` with a
    rigged ``__eq__`` as its digits), iterators as the items they give and a dict's views in
    their order; so the other side rebuilds plain values of its own, and no method of the
    encoded value runs there."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value nests deeper than {MAX_DEPTH} levels")
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", value]  # bool has no subclasses
    if isinstance(value, int):
        if int.bit_length(value) > MAX_BITS:
            raise ValueError(f"an integer of more than {MAX_BITS} bits cannot be judged")
        return ["i", int.__format__(value, "x")]  # hex: no digit limit, linear both ways
    if isinstance(value, float):
        return ["f", float.__float__(value)]
    if isinstance(value, str):
        return ["s", str.__str__(value)]
    if isinstance(value, (bytes, bytearray)):
        return ["y", bytes.hex(bytes(value))]
    if isinstance(value, complex):
        plain = complex(value)
        return ["c", [float.__float__(plain.real), float.__float__(plain.imag)]]
    for base, tag in _SEQUENCES:
        if isinstance(value, base):
            return [tag, [encode(v, depth + 1) for v in base.__iter__(value)]]
    given: Any = value
    if isinstance(value, (dict, _ITEMS)):
        items = dict.items(value) if isinstance(value, dict) else given
        tag = "d" if isinstance(value, dict) else "I"
        return [tag, [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items]]
    for view, tag in ((_KEYS, "K"), (_VALUES, "V")):
        if isinstance(value, view):
            return [tag, [encode(item, depth + 1) for item in given]]
    if hasattr(type(value), "__next__") or isinstance(value, range):
        return ["it", [encode(item, depth + 1) for item in given]]
    raise TypeError(f"a {type(value).__name__} cannot be judged: tests compare plain values")


class Decoder:
    """``encode``'s inverse. Whatever the node holds, it builds no more than the node's own
    size: every key of a set or dict it builds is charged to ``budget``."""

    def __init__(self, budget: HashBudget | None = None) -> None:
        self.budget = budget if budget is not None else HashBudget()

    def decode(self, node: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH + 1 or not isinstance(node, list) or not node:
            raise ValueError("not a value the sandbox writes")
        tag, rest = node[0], node[1:]
        if tag == "n":
            return None
        (payload,) = rest
        if tag == "b" and type(payload) is bool:
            return payload
        if tag == "i" and type(payload) is str:
            if len(payload) > MAX_BITS // 4 + 2:
                raise ValueError(f"an integer of more than {MAX_BITS} bits")
            return int(payload, 16)
        if tag == "f" and type(payload) is float:
            return payload
        if tag == "s" and type(payload) is str:
            return payload
        if tag == "y" and type(payload) is str:
            return bytes.fromhex(payload)
        if tag == "c" and type(payload) is list and [type(p) for p in payload] == [float, float]:
            return complex(payload[0], payload[1])
        if tag in ("l", "t", "S", "F", "it", "K", "V") and type(payload) is list:
            items = [self.decode(v, depth + 1) for v in payload]
            return self._sequence(tag, items)
        if tag in ("d", "I") and type(payload) is list:
            pairs = [(self.decode(k, depth + 1), self.decode(v, depth + 1)) for k, v in payload]
            self.budget.admit(k for k, _ in pairs)
            return dict(pairs) if tag == "d" else dict(pairs).items()
        raise ValueError(f"not a value the sandbox writes (tag {str(tag)[:10]!r})")

    def _sequence(self, tag: str, items: list[Any]) -> Any:
        if tag == "l":
            return items
        if tag == "t":
            return tuple(items)
        if tag == "it":
            return Iterated(items)
        if tag == "V":  # a values view: in order, equal to nothing else (as Python's)
            return dict(enumerate(items)).values()
        keys = self.budget.admit(items)
        if tag == "K":  # a keys view: in order, and compared as a set is
            return dict.fromkeys(keys).keys()
        return set(keys) if tag == "S" else frozenset(keys)


def decode(node: Any) -> Any:
    """One value, decoded with a budget of its own (a probe's arguments, in the sandbox)."""
    return Decoder().decode(node)
