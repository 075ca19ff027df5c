"""The server's interpreter for an assert: plain values in, a value out, every step bounded.

It computes whatever part of an assert does not depend on the solution (``'hello'[::-1]``,
``[i * i for i in range(3)]``, ``'-'.join(...)``, f-strings, ``{...}.keys()``) and the
judgement around the solution's values (``asserts.py``). It knows a few node types, a few
pure builtins (``CALLS``) and an allow-list of pure methods of exact ``str``, ``bytes``,
``list``, ``tuple``, ``dict``, ``set``, ``int`` and ``float`` values (``METHODS``); ``check``
refuses anything else before a run, as ``Unjudgeable``, naming the part. Every value it builds
is charged to a budget, and where one step could amplify (repetition, ``join``, ``replace``,
padding, format widths) the size is checked before it is built; every key of a set or dict it
builds, or looks up, is charged to a ``HashBudget`` first (keys chosen to share one hash make
a table quadratic): neither the task's assert nor the solution's values can make the server
work for long.
"""

from __future__ import annotations

import ast
import copy
import math
import re
import string
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

from rollgym.envs.code.codec import MAX_BITS, HashBudget

MAX_ITEMS = 10**6  # the largest value one step may build (items or characters)
MAX_WORK = 10**7  # all the items and characters one judgement may build
_STEP = 50  # what one comprehension item costs of MAX_WORK: 200,000 items at most (~1 s)
_FORMAT_FIELD = re.compile(r"\d*|[A-Za-z_]\w*")
_WIDE = re.compile(r"\d{7,}")  # a width or precision of a million or more
_MAX_DIGITS = 4300  # Python's own default for str <-> int
# Text codecs whose work grows linearly (punycode, say, can take quadratic time).
_CODECS = frozenset({"utf-8", "utf8", "ascii", "latin-1", "latin1", "utf-16", "utf-32"})


class Unjudgeable(ValueError):
    """A part of an assert this interpreter does not evaluate."""


class ProbeFailed(Exception):
    """The judgement needed the value of a probe that raised in the sandbox."""


class Failed:
    """A probe that raised in the sandbox: an error only if the judgement needs its value."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class Value(ast.Constant):
    """A value the server computed before the run (an item of an unrolled comprehension),
    spelled as a constant: ``ast.unparse`` shows it, ``Interpreter`` returns it."""


class Unrolled(ast.expr):
    """A comprehension whose element calls the solution, unrolled over its items (computed
    before the run): ``items`` holds, per item, its conditions and its element (or key and
    value), each a judgement over probes."""

    _fields = ()

    def __init__(self, kind: str, items: list[tuple[list[ast.expr], list[ast.expr]]]) -> None:
        super().__init__()
        self.kind = kind
        self.items = items


def _range(*args: int) -> list[int]:
    span = range(*args)
    if len(span) > MAX_ITEMS:
        raise ValueError(f"range of {len(span)} items is too large to judge")
    return list(span)


def _round(number: Any, ndigits: Any = None) -> Any:
    if isinstance(ndigits, int) and abs(ndigits) > _MAX_DIGITS:  # round(5, -10**9) builds 10**10**9
        raise ValueError("round to too many digits to judge")
    return round(number, ndigits)


def _type(value: Any) -> type:
    return type(value)  # one argument only: type(name, bases, namespace) makes a class


def _sum(items: Any, start: Any = 0) -> Any:
    if not isinstance(start, (int, float, complex)):  # sum(lists, []) copies quadratically
        raise TypeError("sum is judged over numbers only")
    return sum(items, start)


_TYPES = (int, float, str, bool, bytes, list, tuple, set, frozenset, dict)
CALLS: dict[str, Callable[..., Any]] = {
    **{f.__name__: f for f in (abs, len, sorted, min, max, all, any, isinstance, map,
                               filter, zip, enumerate, reversed, chr, ord, divmod, hex, bin,
                               oct, repr)},
    **{t.__name__: t for t in _TYPES},
    "range": _range,
    "round": _round,
    "sum": _sum,
    "type": _type,
    **{f"math.{n}": getattr(math, n) for n in ("isclose", "fabs", "sqrt", "floor", "ceil",
                                                "isnan", "isinf", "isfinite", "gcd", "log")},
}  # fmt: skip
CONSTANTS: dict[str, Any] = {
    **{t.__name__: t for t in _TYPES},
    "math.pi": math.pi, "math.e": math.e, "math.inf": math.inf,
    "math.nan": math.nan,
}  # fmt: skip
_TEXT = {"upper", "lower", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
         "replace", "count", "index", "rindex", "find", "rfind", "startswith", "endswith",
         "join", "title", "capitalize", "swapcase", "casefold", "isdigit", "isalpha",
         "isalnum", "isspace", "isupper", "islower", "isnumeric", "isdecimal", "partition",
         "rpartition", "removeprefix", "removesuffix", "center", "ljust", "rjust", "zfill"}  # fmt: skip
_SETS = {"union", "intersection", "difference", "symmetric_difference", "issubset",
         "issuperset", "isdisjoint", "copy"}  # fmt: skip
METHODS: dict[type, frozenset[str]] = {
    str: frozenset(_TEXT | {"format", "encode"}),
    bytes: frozenset(_TEXT - {"casefold", "isnumeric", "isdecimal"} | {"decode", "hex"}),
    list: frozenset({"count", "index", "copy"}),
    tuple: frozenset({"count", "index"}),
    dict: frozenset({"keys", "values", "items", "get", "copy"}),
    set: frozenset(_SETS),
    frozenset: frozenset(_SETS),
    int: frozenset({"bit_length", "conjugate"}),
    float: frozenset({"is_integer", "conjugate"}),
}
METHOD_NAMES = frozenset().union(*METHODS.values())
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_PLAIN = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.List, ast.Tuple,
          ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr,
          ast.FormattedValue, ast.Name, ast.Constant, *_COMPS, ast.Call, ast.Attribute)  # fmt: skip


class _Shown(ast.NodeTransformer):
    def visit_Value(self, node: Value) -> ast.expr:
        return ast.copy_location(ast.Constant(node.value), node)


def show(node: ast.AST) -> str:
    """``node`` as source, for messages: a ``Value`` shown as its ``repr``."""
    return ast.unparse(_Shown().visit(copy.deepcopy(node)))


def name_of(node: ast.AST) -> str | None:
    """``f`` for ``f``, ``math.pi`` for ``math.pi``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def targets(node: ast.expr) -> set[str]:
    """The names a comprehension's ``for`` target binds."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def check(node: ast.AST) -> None:
    """Unjudgeable, naming the part, unless ``Interpreter`` evaluates ``node`` (its names are
    the caller's business: bound, a probe, or a known constant)."""
    if isinstance(node, ast.Lambda):
        raise Unjudgeable(
            f"{show(node)!r}: a lambda of the test's own cannot be judged outside the "
            "sandbox (use a builtin such as key=abs, or compare plain values)"
        )
    if isinstance(node, (Value, Unrolled)):
        return
    if isinstance(node, ast.expr) and not isinstance(node, _PLAIN):
        raise Unjudgeable(f"{show(node)!r} is not an expression the server evaluates")
    if isinstance(node, ast.comprehension) and node.is_async:
        raise Unjudgeable("an async comprehension cannot be judged")
    if isinstance(node, ast.keyword) and node.arg is None:
        raise Unjudgeable(f"'**{show(node.value)}' cannot be judged outside the sandbox")
    if isinstance(node, ast.Dict) and None in node.keys:
        raise Unjudgeable(f"{show(node)!r}: '**' in a dict cannot be judged")
    if isinstance(node, ast.comprehension):
        bind(node.target, None, dry=True)
    if isinstance(node, ast.Attribute) and name_of(node) not in {**CONSTANTS, **CALLS}:
        raise Unjudgeable(f"{show(node)!r} is not a value the server knows")
    if isinstance(node, ast.Call):
        func, name = node.func, name_of(node.func)
        if name in CALLS:
            pass
        elif isinstance(func, ast.Attribute) and func.attr in METHOD_NAMES:
            check(func.value)
        else:
            raise Unjudgeable(
                f"{show(node)!r} calls {show(func)!r}, which the server does not "
                "evaluate (only pure builtins and methods such as join, split, keys)"
            )
        for part in [*node.args, *node.keywords]:
            check(part)
        return
    for child in ast.iter_child_nodes(node):
        check(child)


class Interpreter:
    """Evaluates what ``check`` allows, over ``names`` (probe values and bound variables)."""

    def __init__(
        self,
        names: MutableMapping[str, Any],
        spent: list[int] | None = None,
        budget: HashBudget | None = None,
    ) -> None:
        self.names = names
        self._spent = spent if spent is not None else [0]
        self.budget = budget if budget is not None else HashBudget()

    def charge(self, value: Any, size: int | None = None) -> Any:
        if size is None:
            sized = isinstance(value, (str, bytes, list, tuple, dict, set))
            size = len(value) if sized else 1
        self._spent[0] += size
        if self._spent[0] > MAX_WORK:
            raise ValueError("the judgement builds too much to judge")
        return value

    def within(self, bound: dict[str, Any]) -> Interpreter:
        return Interpreter(ChainMap(bound, self.names), self._spent, self.budget)

    def keys(self, items: Iterable[Any]) -> list[Any]:
        """``items`` as a list, charged to the hash budget: before a table holds them."""
        return self.budget.admit(items)

    def _pairs(self, pairs: Iterable[tuple[Any, Any]]) -> dict[Any, Any]:
        listed = list(pairs)
        self.keys(k for k, _ in listed)
        return dict(listed)

    def run(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):  # Value too
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names:
            value = self.names[node.id]
            if isinstance(value, Failed):
                raise ProbeFailed(f"the solution raised {value.why}")
            return value
        name = name_of(node)
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in CALLS:
            return CALLS[name]
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise Unjudgeable(f"cannot judge {type(node).__name__}")
        return self.charge(method(node))

    def _items(self, nodes: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for e in nodes:
            if isinstance(e, ast.Starred):
                out.extend(self.charge(list(self.run(e.value))))
            else:
                out.append(self.run(e))
        return out

    def _Compare(self, node: ast.Compare) -> bool:
        left = self.run(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.run(comparator)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, TABLES):
                items = isinstance(right, _ITEMS) and isinstance(left, tuple) and len(left) == 2
                self.keys([left[0] if items else left])  # a lookup walks the key's chain
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        last: Any = None
        for operand in node.values:
            last = self.run(operand)
            if bool(last) is isinstance(node.op, ast.Or):
                return last
        return last

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.run(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        if isinstance(node.op, ast.USub):
            return -value
        return +value if isinstance(node.op, ast.UAdd) else ~value

    def _BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.run(node.left), self.run(node.right)
        if isinstance(node.op, _SET_OPS) and (
            isinstance(left, TABLES) or isinstance(right, TABLES)
        ):
            self.keys(left)  # | & - ^ of a table: a table of both sides' items
            self.keys(right)
        return binary(node.op, left, right)

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.run(node.body) if self.run(node.test) else self.run(node.orelse)

    def _List(self, node: ast.List) -> list[Any]:
        return self._items(node.elts)

    def _Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self._items(node.elts))

    def _Set(self, node: ast.Set) -> set[Any]:
        return set(self.keys(self._items(node.elts)))

    def _Dict(self, node: ast.Dict) -> dict[Any, Any]:
        pairs = zip(node.keys, node.values, strict=True)
        return self._pairs((self.run(k), self.run(v)) for k, v in pairs if k is not None)

    def _Subscript(self, node: ast.Subscript) -> Any:
        value, key = self.run(node.value), self.run(node.slice)
        if isinstance(value, dict):
            self.keys([key])
        return value[key]

    def _Slice(self, node: ast.Slice) -> slice:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.run(p) for p in parts))

    def _JoinedStr(self, node: ast.JoinedStr) -> str:
        return "".join(str(self.run(v)) for v in node.values)

    def _FormattedValue(self, node: ast.FormattedValue) -> str:
        value = self.run(node.value)
        shown: dict[int, Callable[[Any], str]] = {115: str, 114: repr, 97: ascii}
        value = shown[node.conversion](value) if node.conversion in shown else value
        spec = "" if node.format_spec is None else str(self.run(node.format_spec))
        if _WIDE.search(spec) or "{" in spec:
            raise ValueError("a format width too large to judge")
        return format(value, spec)

    def _Call(self, node: ast.Call) -> Any:
        args = self._items(node.args)
        kwargs = {k.arg: self.run(k.value) for k in node.keywords if k.arg}
        name = name_of(node.func)
        if name in ("set", "frozenset") and args:
            args = [self.keys(args[0]), *args[1:]]
        elif name == "dict" and args:
            given = args[0].items() if isinstance(args[0], dict) else args[0]
            pairs = [tuple(pair) for pair in given]
            self.keys(pair[0] for pair in pairs if pair)
            args = [pairs, *args[1:]]
        if name in CALLS:
            return CALLS[name](*args, **kwargs)
        if not isinstance(node.func, ast.Attribute):
            raise Unjudgeable(f"cannot call {show(node.func)!r}")
        receiver, method = self.run(node.func.value), node.func.attr
        if isinstance(receiver, (set, frozenset)):  # each argument's items meet the table
            args = [self.keys(arg) for arg in args]
        elif isinstance(receiver, dict) and method == "get":
            self.keys(args[:1])
        return call_method(receiver, method, args, kwargs)

    def _bindings(self, generators: list[ast.comprehension]) -> Iterator[Interpreter]:
        def step(at: int, scope: Interpreter) -> Iterator[Interpreter]:
            if at == len(generators):
                yield scope
                return
            gen = generators[at]
            for item in scope.run(gen.iter):
                inner = scope.within(bind(gen.target, item))
                inner.charge(None, _STEP)
                if all(inner.run(cond) for cond in gen.ifs):
                    yield from step(at + 1, inner)

        return step(0, self)

    def _ListComp(self, node: ast.ListComp) -> list[Any]:
        return [scope.run(node.elt) for scope in self._bindings(node.generators)]

    def _SetComp(self, node: ast.SetComp) -> set[Any]:
        return set(self.keys(scope.run(node.elt) for scope in self._bindings(node.generators)))

    def _DictComp(self, node: ast.DictComp) -> dict[Any, Any]:
        scopes = self._bindings(node.generators)
        return self._pairs((s.run(node.key), s.run(node.value)) for s in scopes)

    def _GeneratorExp(self, node: ast.GeneratorExp) -> Iterator[Any]:
        # Lazy, as in Python: all() and any() stop at the first item that decides.
        return (scope.run(node.elt) for scope in self._bindings(node.generators))

    def _Unrolled(self, node: Unrolled) -> Any:
        kept = [parts for conds, parts in node.items if all(self.run(c) for c in conds)]
        if node.kind == "dict":
            return self._pairs((self.run(k), self.run(v)) for k, v in kept)
        values = (self.run(parts[0]) for parts in kept)
        if node.kind == "gen":
            return values
        return set(self.keys(values)) if node.kind == "set" else list(values)


def bind(target: ast.expr, value: Any, dry: bool = False) -> dict[str, Any]:
    """The names a ``for`` target binds to ``value``, unpacking tuples as Python does
    (``dry``: only whether the target can be judged)."""
    if isinstance(target, ast.Name):
        return {target.id: value}
    if isinstance(target, (ast.Tuple, ast.List)) and not any(
        isinstance(e, ast.Starred) for e in target.elts
    ):
        if dry:
            return {k: v for e in target.elts for k, v in bind(e, None, dry).items()}
        items = list(value)
        if len(items) != len(target.elts):
            raise ValueError(f"cannot unpack {len(items)} values into {len(target.elts)}")
        out: dict[str, Any] = {}
        for e, v in zip(target.elts, items, strict=True):
            out.update(bind(e, v))
        return out
    raise Unjudgeable(f"the target {show(target)!r} cannot be judged")


def call_method(receiver: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``receiver.name(*args, **kwargs)`` for an allowed method of an exact plain type, its
    result's size checked first where the method could amplify."""
    if name not in METHODS.get(type(receiver), ()):
        raise TypeError(f"{type(receiver).__name__}.{name} is not judged")
    if name == "join":
        parts = list(args[0]) if args else []
        sized = [len(p) for p in parts if isinstance(p, (str, bytes))]
        _fits(sum(sized) + len(receiver) * len(parts))
        args = [parts, *args[1:]]
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        times = receiver.count(old) if old else len(receiver) + 1
        if isinstance(new, (str, bytes)):
            _fits(len(receiver) + times * len(new))
    elif name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        _fits(args[0])
    elif name in ("encode", "decode"):
        codec = args[0] if args else kwargs.get("encoding", "utf-8")
        if not isinstance(codec, str) or codec.lower() not in _CODECS:
            raise TypeError(f"the codec {codec!r} is not judged")
    elif name == "format":
        for _, field, spec, _ in string.Formatter().parse(receiver):
            if field is not None and not _FORMAT_FIELD.fullmatch(field):
                raise TypeError("a format field other than a plain name or index is not judged")
            if spec and (_WIDE.search(spec) or "{" in spec):
                raise ValueError("a format width too large to judge")
    return getattr(receiver, name)(*args, **kwargs)


def _fits(size: int) -> None:
    if size > MAX_ITEMS:
        raise ValueError(f"a value of {size} items is too large to judge")


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
}  # fmt: skip
_SEQUENCES = (str, bytes, list, tuple)
_ITEMS: type[Any] = type({}.items())
TABLES: tuple[type[Any], ...] = (set, frozenset, dict, type({}.keys()), _ITEMS)
"""Values that are hash tables: a key looked up in one, or an item added, is charged."""
_SET_OPS = (ast.BitOr, ast.BitAnd, ast.BitXor, ast.Sub)
_NUMBERS = (int, float, complex)
_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y,
    ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y,
    ast.Pow: lambda x, y: x**y, ast.LShift: lambda x, y: x << y,
    ast.RShift: lambda x, y: x >> y, ast.BitAnd: lambda x, y: x & y,
    ast.BitOr: lambda x, y: x | y, ast.BitXor: lambda x, y: x ^ y,
}  # fmt: skip


def binary(op: ast.operator, a: Any, b: Any) -> Any:
    """Python's operators, but none that can make the server build something huge."""
    if isinstance(op, ast.Mult) and isinstance(a, _SEQUENCES) != isinstance(b, _SEQUENCES):
        seq, times = (a, b) if isinstance(a, _SEQUENCES) else (b, a)
        if isinstance(times, int):
            _fits(len(seq) * times)
    if isinstance(op, ast.Mod) and not (isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS)):
        raise TypeError("% is judged between numbers only (a format string could be huge)")
    if isinstance(op, (ast.Pow, ast.LShift)) and isinstance(a, int) and isinstance(b, int):
        bits = b if isinstance(op, ast.LShift) else a.bit_length() * b
        if bits > MAX_BITS:
            raise ValueError("an integer too large to judge")
    if type(op) not in _OPERATORS:
        raise TypeError(f"operator {type(op).__name__} is not judged")
    return _OPERATORS[type(op)](a, b)
