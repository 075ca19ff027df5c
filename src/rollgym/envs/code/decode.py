"""The launcher's report read back: the probes' values as plain values of the server's own.

The line may be the program's forgery (``asserts.py`` says why that gains it nothing): the
reader never raises, and refuses what would make the server work for long.
"""

from __future__ import annotations

import json
from typing import Any

from rollgym.envs.code.interpret import Failed, Iterated
from rollgym.envs.code.launcher import MAX_DEPTH

_MAX_DIGITS = 4300  # Python's own default for str <-> int
_MAX_CLASHES = 64  # distinct values sharing a hash with another in one report


def read_report(data: bytes, probes: int) -> list[Any] | str:
    """The probes' values from the launcher's report line, or why it cannot be read. The
    line may be the program's forgery: whatever it holds, this returns, never raises."""
    lines = data.strip().split(b"\n")
    if not lines or not lines[-1]:
        return "the program ended before its tests were evaluated"
    try:
        report = json.loads(lines[-1])
        if not isinstance(report, list) or len(report) != probes:
            return "the report has the wrong shape"
        decoder = _Decoder()
        out: list[Any] = []
        for entry in report:
            if entry[0] == "ok":
                out.append(decoder.decode(entry[1]))
            else:
                out.append(Failed(str(entry[1])[:300]))
        return out
    except Exception as exc:  # a forged or broken report: the program's doing
        return f"a value could not be read: {type(exc).__name__}: {str(exc)[:200]}"


class _Decoder:
    """Turns ``launcher.encode``'s tagged JSON back into plain values, refusing what would
    make the server work for long: numbers chosen to share one hash (a set of them takes
    quadratic time to build), integers past Python's digit limit, deep nesting."""

    def __init__(self) -> None:
        self._first: dict[int, Any] = {}
        self._clashes = 0

    def _hashed(self, value: Any) -> Any:
        try:
            key = hash(value)
        except TypeError:  # a tuple holding a list: never a set member or a key anyway
            return value
        first = self._first.setdefault(key, value)
        if first is not value and first != value:
            self._clashes += 1
            if self._clashes > _MAX_CLASHES:
                raise ValueError("values chosen to collide in hash tables")
        return value

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
            if len(payload) > _MAX_DIGITS + 1:
                raise ValueError(f"an integer of more than {_MAX_DIGITS} digits")
            return self._hashed(int(payload))
        if tag == "f" and type(payload) is float:
            return self._hashed(payload)
        if tag == "s" and type(payload) is str:
            return payload
        if tag == "y" and type(payload) is str:
            return bytes.fromhex(payload)
        if tag == "c" and type(payload) is list and [type(p) for p in payload] == [float, float]:
            return self._hashed(complex(payload[0], payload[1]))
        if tag in ("l", "t", "S", "F", "it") and type(payload) is list:
            items = [self.decode(v, depth + 1) for v in payload]
            if tag == "it":
                return Iterated(items)
            if tag == "l":
                return items
            if tag == "t":
                return self._hashed(tuple(items))
            return set(items) if tag == "S" else self._hashed(frozenset(items))
        if tag == "d" and type(payload) is list:
            pairs = [(self.decode(k, depth + 1), self.decode(v, depth + 1)) for k, v in payload]
            return dict(pairs)
        raise ValueError(f"not a value the sandbox writes (tag {str(tag)[:10]!r})")
