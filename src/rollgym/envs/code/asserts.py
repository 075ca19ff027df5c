"""Assert tests judged outside the sandbox: the solution computes, the server compares.

An assert test such as ``assert add(1, 2) == 3`` used to run after the solution in one
process, passing when that process exited 0, so ``os._exit(0)``, an ``atexit`` hook, an object
whose ``__eq__`` is always true or reading the asserts back from the file all "passed". Now:

1. The assert is parsed here (trusted task data, never model output) and split into *probes*,
   the largest sub-expressions that depend on the solution (``add(1, 2)``; any name other than
   a few pure builtins), and the *judgement* around them (``_ == 3``).
2. Only the probes enter the sandbox; its launcher evaluates each after the solution ran and
   reports the values as plain tagged JSON (``launcher.encode``: exact types only).
3. The server evaluates the judgement over the decoded values with a small interpreter of a
   few node types (comparisons, boolean and arithmetic operators, literals and pure builtins),
   each bounded in size. A missing report is a ``runtime_error``; a false judgement a
   ``wrong_answer``.

A probe may not contain a comparison (``all(f(i) == i * i for i in ...)`` would compare inside
the sandbox, where the solution can rig ``__eq__``): such an assert, or a statement that is not
an ``assert``, is refused (422) naming it, rather than judged in a way that can be forged.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollgym.envs.code.launcher import MAX_DEPTH
from rollgym.errors import InvalidRequest

_MAX_ITEMS = 10**6  # the largest sequence the judgement may build (``[0] * n``, ``range(n)``)
_MAX_BITS = 2**20  # the largest integer ``**`` or ``<<`` may build, in bits
_MAX_DIGITS = 4300  # Python's own default for str <-> int
_MAX_CLASHES = 64  # distinct values sharing a hash with another in one report


def _range(*args: int) -> list[int]:
    span = range(*args)
    if len(span) > _MAX_ITEMS:
        raise ValueError(f"range of {len(span)} items is too large to judge")
    return list(span)


_CALLS: dict[str, Callable[..., Any]] = {
    **{f.__name__: f for f in (abs, len, sorted, sum, min, max, round, all, any, isinstance)},
    **{t.__name__: t for t in (int, float, str, bool, list, tuple, set, frozenset, dict)},
    "range": _range,
    **{f"math.{n}": getattr(math, n) for n in ("isclose", "fabs", "sqrt", "floor", "ceil",
                                                "isnan", "isinf", "isfinite", "gcd", "log")},
}  # fmt: skip
_CONSTANTS: dict[str, Any] = {
    **{t.__name__: t for t in (int, float, str, bool, list, tuple, set, frozenset, dict)},
    "math.pi": math.pi, "math.e": math.e, "math.inf": math.inf, "math.nan": math.nan,
}  # fmt: skip
_PROBE = "__rollgym_probe_"


@dataclass(frozen=True)
class Judged:
    """One assert: the probes the sandbox evaluates, and the judgement over their values."""

    source: str
    probes: tuple[str, ...]
    tests: tuple[ast.expr, ...]  # one per assert statement, probes replaced by names

    def judge(self, report: list[Any]) -> tuple[bool, str | None]:
        """True when every assert holds over the reported values; else False and why."""
        values: dict[str, Any] = {}
        for i, entry in enumerate(report):
            values[f"{_PROBE}{i}"] = entry
        try:
            for test in self.tests:
                if not bool(_Eval(values).run(test)):
                    return False, "the assertion does not hold"
        except _ProbeFailed as exc:
            return False, str(exc)
        except Exception as exc:  # the assert raising on the values, as it would in Python
            return False, f"the assertion raised {type(exc).__name__}"
        return True, None


class _ProbeFailed(Exception):
    pass


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class _Split(ast.NodeTransformer):
    """Replaces each solution-dependent sub-expression by a probe name."""

    def __init__(self) -> None:
        self.probes: list[str] = []

    def _probe(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Lambda):
            raise ValueError(
                f"{ast.unparse(node)!r}: a lambda of the test's own cannot be judged outside "
                "the sandbox (use a builtin such as key=abs, or compare plain values)"
            )
        if any(isinstance(n, ast.Compare) for n in ast.walk(node)):
            raise ValueError(
                f"{ast.unparse(node)!r} compares inside the solution's code, where the "
                "comparison can be rigged: compare its result at the top of the assert"
            )
        self.probes.append(ast.unparse(node))
        return ast.copy_location(ast.Name(f"{_PROBE}{len(self.probes) - 1}", ast.Load()), node)

    def visit(self, node: ast.AST) -> Any:
        if not isinstance(node, ast.expr) or isinstance(node, ast.Constant):  # operators too
            return node
        if isinstance(node, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp)):
            return self.generic_visit(node)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return self._probe(node)
            return self.generic_visit(node)
        if isinstance(node, ast.Dict):
            return self._probe(node) if None in node.keys else self.generic_visit(node)
        name = _name(node)
        if name in _CONSTANTS or name in _CALLS:  # a type, or a builtin passed as key=abs
            return node
        if isinstance(node, ast.Call) and _name(node.func) in _CALLS:
            plain = not any(isinstance(a, ast.Starred) for a in node.args)
            if plain and all(k.arg is not None for k in node.keywords):
                node.args = [self.visit(a) for a in node.args]
                for k in node.keywords:
                    k.value = self.visit(k.value)
                return node
        return self._probe(node)


@functools.lru_cache(maxsize=4096)
def parse_assert(source: str, where: str) -> Judged:
    """``source`` (one or more ``assert`` statements) split for judging; 422 naming ``where``
    when it cannot be judged outside the sandbox."""
    try:
        body = ast.parse(source).body
        if not body:
            raise ValueError("it is empty")
        split = _Split()
        tests = []
        for stmt in body:
            if not isinstance(stmt, ast.Assert):
                raise ValueError(
                    f"line {stmt.lineno} is not an assert statement: only asserts can be "
                    "judged outside the solution's process"
                )
            tests.append(split.visit(stmt.test))
    except (SyntaxError, ValueError) as exc:
        raise InvalidRequest(f"{where}: {exc}", status=422) from None
    return Judged(source, tuple(split.probes), tuple(tests))


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
                out.append(_Failed(str(entry[1])[:300]))
        return out
    except Exception as exc:  # a forged or broken report: the program's doing
        return f"a value could not be read: {type(exc).__name__}: {str(exc)[:200]}"


@dataclass(frozen=True)
class _Failed:
    """A probe that raised in the sandbox: an error only if the judgement needs its value."""

    why: str


class Iterated:
    """What an iterator or generator gave: iterable (``list(x)``, ``sorted(x)``), but equal
    to nothing else, as a generator is in Python."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __iter__(self) -> Any:
        return iter(self.items)


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


class _Eval:
    """Evaluates a judgement: the few node types ``_Split`` leaves, over plain values."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def run(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id.startswith(_PROBE):
            value = self.values[node.id]
            if isinstance(value, _Failed):
                raise _ProbeFailed(f"the solution raised {value.why}")
            return value
        name = _name(node)
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        if name in _CALLS:
            return _CALLS[name]
        if isinstance(node, ast.Compare):
            left = self.run(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self.run(comparator)
                if not _compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            last: Any = None
            for operand in node.values:
                last = self.run(operand)
                if bool(last) is isinstance(node.op, ast.Or):
                    return last
            return last
        if isinstance(node, ast.UnaryOp):
            return _unary(node.op, self.run(node.operand))
        if isinstance(node, ast.BinOp):
            return _binary(node.op, self.run(node.left), self.run(node.right))
        if isinstance(node, ast.IfExp):
            return self.run(node.body) if self.run(node.test) else self.run(node.orelse)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.run(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            pairs = zip(node.keys, node.values, strict=True)
            return {self.run(k): self.run(v) for k, v in pairs if k is not None}
        if isinstance(node, ast.Call) and name is None:
            fn = _CALLS[_name(node.func) or ""]
            args = [self.run(a) for a in node.args]
            return fn(*args, **{k.arg: self.run(k.value) for k in node.keywords if k.arg})
        raise TypeError(f"cannot judge {type(node).__name__}")


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
}  # fmt: skip


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    return bool(_COMPARE[type(op)](left, right))


def _unary(op: ast.unaryop, value: Any) -> Any:
    if isinstance(op, ast.Not):
        return not value
    if isinstance(op, ast.USub):
        return -value
    if isinstance(op, ast.UAdd):
        return +value
    return ~value


_SEQUENCES = (str, bytes, list, tuple)
_NUMBERS = (int, float, complex)


def _binary(op: ast.operator, a: Any, b: Any) -> Any:
    """Python's operators, but none that can make the server build something huge."""
    if isinstance(op, ast.Mult) and isinstance(a, _SEQUENCES) != isinstance(b, _SEQUENCES):
        seq, times = (a, b) if isinstance(a, _SEQUENCES) else (b, a)
        if isinstance(times, int) and len(seq) * times > _MAX_ITEMS:
            raise ValueError("a repetition too large to judge")
    if isinstance(op, ast.Mod) and not (isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS)):
        raise TypeError("% is judged between numbers only (a format string could be huge)")
    if isinstance(op, (ast.Pow, ast.LShift)) and isinstance(a, int) and isinstance(b, int):
        bits = b if isinstance(op, ast.LShift) else a.bit_length() * b
        if bits > _MAX_BITS:
            raise ValueError("an integer too large to judge")
    operators: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
        ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
        ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y,
        ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y,
        ast.Pow: lambda x, y: x**y, ast.LShift: lambda x, y: x << y,
        ast.RShift: lambda x, y: x >> y, ast.BitAnd: lambda x, y: x & y,
        ast.BitOr: lambda x, y: x | y, ast.BitXor: lambda x, y: x ^ y,
    }  # fmt: skip
    if type(op) not in operators:
        raise TypeError(f"operator {type(op).__name__} is not judged")
    return operators[type(op)](a, b)
