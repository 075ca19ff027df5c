"""Assert tests judged outside the sandbox: the solution computes, the server compares.

An assert such as ``assert add(1, 2) == 3`` used to run after the solution in one process,
passing when that process exited 0, so ``os._exit(0)``, an ``atexit`` hook, an object whose
``__eq__`` is always true or reading the asserts back from the file all "passed". Now:

1. The assert is parsed here (trusted task data, never model output) and split into *probes*,
   the smallest sub-expressions whose value is the solution's (``add(1, 2)``: a name the
   server does not know as a pure builtin, called or read), and the *judgement* around them
   (``_ == 3``). Everything that does not depend on the solution (``'hello'[::-1]``,
   ``[i * i for i in range(3)]``, ``'-'.join(...)``, f-strings, ``{...}.keys()``) stays in the
   judgement, computed by the server's bounded interpreter (``interpret.py``); a part it
   cannot compute is refused (422) naming it, never sent into the sandbox; so is a part made
   only of builtins or library modules it does not know (``pow(2, 10)``, ``re.split(...)``),
   which the solution could rig.
2. A probe's own arguments that do not depend on the solution are computed here too and sent
   as values (``rev(__rollgym_arg_0)`` with ``'hello'``), decoded before the solution's first
   line. A comprehension whose element calls the solution (``all(f(i) == i * i for i in
   range(3))``) is unrolled over its items, computed here: one probe per call, the comparison
   in the judgement. One over the solution's own values (``for i in f(3)``) is refused.
3. The launcher evaluates the probes after the solution ran and reports their values as plain
   tagged JSON (``codec.encode``); the server decodes them (``decode.py``, bounded) and
   evaluates the judgement. A missing or unreadable report is a ``runtime_error``; a false judgement a
   ``wrong_answer``.

Why the report needs no secret: the solution runs in the interpreter that evaluates the
probes, so it can write whatever that interpreter can (the control pipe's number is in
``/proc/self/fd``; a key or nonce in memory is readable through ``gc`` or ``ctypes``; a forked
child that runs the probes is the solution's process too). No framing, key or fork can tell
its report from the harness's. Soundness comes from what a report may say instead: only the
values of the solution's own calls, on arguments the server chose, in the number the server
asked for. Forging one is answering the call, which an honest solution does by returning the
value; rigging ``builtins`` changes only what its own calls give. Everything the answer is
compared with, and the shape of the comparison (which items, how many, ``all`` over what), is
the server's, so a forged report can claim nothing that a correct solution would not return.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import sys
from dataclasses import dataclass
from typing import Any

from rollgym.envs.code.codec import ProbeSpec, encode
from rollgym.envs.code.interpret import (
    CALLS,
    CONSTANTS,
    METHOD_NAMES,
    Interpreter,
    ProbeFailed,
    Unrolled,
    Value,
    bind,
    check,
    name_of,
    show,
    targets,
)
from rollgym.errors import InvalidRequest

_MAX_PROBES = 2000  # per assert, unrolled ones included: about 0.3 s to split, once per row
_PROBE = "__rollgym_probe_"
_ARG = "__rollgym_arg_"
_BUILTINS = frozenset(dir(builtins))
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_KINDS = {ast.ListComp: "list", ast.SetComp: "set", ast.DictComp: "dict", ast.GeneratorExp: "gen"}
# Nodes whose value the judgement builds from their parts, whatever the parts depend on.
_STRUCTURE = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.List, ast.Tuple,
              ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr,
              ast.FormattedValue)  # fmt: skip


@dataclass(frozen=True)
class Judged:
    """One assert: the probes the sandbox evaluates, and the judgement over their values."""

    source: str
    probes: tuple[ProbeSpec, ...]
    tests: tuple[ast.expr, ...]  # one per assert statement, probes replaced by names

    def judge(self, report: list[Any]) -> tuple[bool, str | None]:
        """True when every assert holds over the reported values; else False and why."""
        values = {f"{_PROBE}{i}": entry for i, entry in enumerate(report)}
        interpreter = Interpreter(values)
        try:
            for test in self.tests:
                if not bool(interpreter.run(test)):
                    return False, "the assertion does not hold"
        except ProbeFailed as exc:
            return False, str(exc)
        except Exception as exc:  # the assert raising on the values, as it would in Python
            return False, f"the assertion raised {type(exc).__name__}"
        return True, None


class _ClassAsType(ast.NodeTransformer):
    """``x.__class__`` read as ``type(x)``: the server's ``type`` of the reported value, never
    an attribute read of the solution's object in the sandbox (a type cannot be reported)."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        self.generic_visit(node)
        if node.attr != "__class__" or not isinstance(node.ctx, ast.Load):
            return node
        call = ast.Call(ast.Name("type", ast.Load()), [node.value], [])
        return ast.copy_location(call, node)


def _elements(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.DictComp):
        return [node.key, node.value]
    assert isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp))
    return [node.elt]


def _depends(node: ast.AST, bound: frozenset[str]) -> bool:
    """Whether ``node``'s value may be the solution's: it names something other than a pure
    builtin, a known constant or a variable the assert itself binds (``bound``)."""
    name = name_of(node)
    if name in CALLS or name in CONSTANTS:
        return False
    if isinstance(node, ast.Name):
        return node.id not in bound
    if isinstance(node, _COMPS):
        inner = bound
        for gen in node.generators:
            if _depends(gen.iter, inner):
                return True
            inner = inner | targets(gen.target)
            if any(_depends(c, inner) for c in gen.ifs):
                return True
        return any(_depends(e, inner) for e in _elements(node))
    if isinstance(node, ast.Lambda):
        a = node.args
        names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        defaults = [d for d in [*a.defaults, *a.kw_defaults] if d is not None]
        return any(_depends(d, bound) for d in defaults) or _depends(node.body, bound | names)
    return any(_depends(c, bound) for c in ast.iter_child_nodes(node))


class _Substitute(ast.NodeTransformer):
    """A comprehension's variables replaced by their values (``Value``), as Python scopes
    them: a nested comprehension's or lambda's own names are left alone."""

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.env:
            value: ast.expr = ast.copy_location(Value(self.env[node.id]), node)
            return value
        return node

    def _shadowed(self, names: set[str]) -> _Substitute:
        return _Substitute({k: v for k, v in self.env.items() if k not in names})

    def _comprehension(self, node: Any) -> Any:
        first = node.generators[0]
        first.iter = self.visit(first.iter)  # the first iterable is the enclosing scope's
        inner = self._shadowed({n for g in node.generators for n in targets(g.target)})
        for i, gen in enumerate(node.generators):
            if i:
                gen.iter = inner.visit(gen.iter)
            gen.ifs = [inner.visit(c) for c in gen.ifs]
        for field in ("elt", "key", "value"):
            if hasattr(node, field):
                setattr(node, field, inner.visit(getattr(node, field)))
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        a = node.args
        names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x}
        node.body = self._shadowed(names).visit(node.body)
        return node


def _substitute(node: ast.expr, env: dict[str, Any]) -> ast.expr:
    if not env:
        return node
    out: ast.expr = _Substitute(env).visit(copy.deepcopy(node))
    return out


def _computed(node: ast.expr) -> Any:
    """``node`` (which does not depend on the solution) evaluated now, or why not (422)."""
    check(node)
    try:
        return Interpreter({}).run(node)
    except Exception as exc:
        raise ValueError(
            f"{show(node)!r} cannot be computed before the run: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None


class _Split:
    """Builds the judgement of an assert, putting each solution-dependent part in a probe."""

    def __init__(self) -> None:
        self.probes: list[ProbeSpec] = []
        self.args = 0

    def visit(self, node: ast.expr, bound: frozenset[str] = frozenset()) -> ast.expr:
        if not _depends(node, bound):
            check(node)  # the server computes it: refused here, naming it, if it cannot
            return node
        if isinstance(node, ast.Lambda):
            check(node)  # refuses it, naming it
        if isinstance(node, _COMPS):
            return self._comprehension(node, bound)
        if isinstance(node, ast.Call) and self._judged_call(node, bound):
            func = node.func
            if isinstance(func, ast.Attribute) and name_of(func) not in CALLS:
                func = ast.Attribute(self.visit(func.value, bound), func.attr, ast.Load())
            args = [self.visit(a, bound) for a in node.args]
            keywords = [ast.keyword(k.arg, self.visit(k.value, bound)) for k in node.keywords]
            return ast.Call(func, args, keywords)
        if isinstance(node, ast.Dict) and None in node.keys:
            raise ValueError(f"{show(node)!r}: '**' in a dict cannot be judged")
        if isinstance(node, _STRUCTURE):
            new = copy.copy(node)
            for field, value in ast.iter_fields(node):
                if isinstance(value, ast.expr):
                    setattr(new, field, self.visit(value, bound))
                elif isinstance(value, list):
                    parts = [self.visit(v, bound) if isinstance(v, ast.expr) else v for v in value]
                    setattr(new, field, parts)
            return new
        return self._probe(node, bound)

    def _judged_call(self, node: ast.Call, bound: frozenset[str]) -> bool:
        """A pure builtin, or an allowed method of a value: computed by the judgement. A
        method of a bare name the solution owns (``re.split``, ``obj.count``) is a probe."""
        if any(k.arg is None for k in node.keywords):
            return False
        func = node.func
        if name_of(func) in CALLS:
            return True
        if not isinstance(func, ast.Attribute) or func.attr not in METHOD_NAMES:
            return False
        return not (isinstance(func.value, ast.Name) and func.value.id not in bound)

    def _comprehension(self, node: Any, bound: frozenset[str]) -> ast.expr:
        inner = bound.union(*(targets(g.target) for g in node.generators))
        parts = [*_elements(node), *(c for g in node.generators for c in g.ifs)]
        if any(_depends(p, inner) for p in parts):
            return self._unroll(node, bound)
        # Only the iterables depend on the solution: the judgement runs the comprehension.
        new = copy.copy(node)
        new.generators, scope = [], bound
        for gen in node.generators:
            if gen.is_async:
                raise ValueError(f"{show(node)!r}: an async comprehension")
            bind(gen.target, None, dry=True)
            iterable = self.visit(gen.iter, scope)
            scope = scope | targets(gen.target)
            for cond in gen.ifs:
                check(cond)
            new.generators.append(ast.comprehension(gen.target, iterable, gen.ifs, 0))
        for element in _elements(node):
            check(element)
        judged: ast.expr = new
        return judged

    def _unroll(self, node: Any, bound: frozenset[str]) -> ast.expr:
        """A comprehension whose element (or condition) calls the solution: its items are
        computed here, and each item's element is judged with probes of its own."""
        states: list[tuple[dict[str, Any], list[ast.expr]]] = [({}, [])]
        for gen in node.generators:
            if gen.is_async:
                raise ValueError(f"{show(node)!r}: an async comprehension")
            bind(gen.target, None, dry=True)
            following: list[tuple[dict[str, Any], list[ast.expr]]] = []
            for env, conds in states:
                iterable = _substitute(gen.iter, env)
                if _depends(iterable, bound):
                    raise ValueError(
                        f"{show(node)!r} calls the solution for each item of "
                        f"{show(gen.iter)!r}, which the solution gives: the server "
                        "cannot know the items before the run (write one assert per item, "
                        "or compare the solution's result as a whole)"
                    )
                for item in _computed(ast.Call(ast.Name("list", ast.Load()), [iterable], [])):
                    scope = {**env, **bind(gen.target, item)}
                    pending, kept = list(conds), True
                    for cond in gen.ifs:
                        cond = _substitute(cond, scope)
                        if _depends(cond, bound):
                            pending.append(cond)  # judged with the item's probes
                        elif not _computed(cond):
                            kept = False
                            break
                    if kept:
                        following.append((scope, pending))
                    if len(following) > _MAX_PROBES:
                        raise ValueError(f"{show(node)!r} has too many items to judge")
            states = following
        items = [
            (
                [self.visit(c, bound) for c in conds],
                [self.visit(_substitute(e, env), bound) for e in _elements(node)],
            )
            for env, conds in states
        ]
        return Unrolled(_KINDS[type(node)], items)

    def _probe(self, node: ast.expr, bound: frozenset[str]) -> ast.expr:
        shown = show(node)
        taken = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & bound
        if taken:
            raise ValueError(
                f"{shown!r} calls the solution with {', '.join(sorted(taken))}, which a "
                "comprehension takes from the solution's own values: the server cannot know "
                "them before the run"
            )
        if not _owned(node):
            raise ValueError(
                f"{shown!r} uses only builtins or library modules the server does not "
                "evaluate, which the solution could rig: write its value as a literal"
            )
        if len(self.probes) >= _MAX_PROBES:
            raise ValueError(f"more than {_MAX_PROBES} calls of the solution in one assert")
        args: dict[str, Any] = {}
        expr = self._send(copy.deepcopy(node), args)
        if any(isinstance(n, Value) for n in ast.walk(expr)):
            raise ValueError(f"{shown!r}: a value in it cannot be sent into the sandbox")
        self.probes.append({"expr": ast.unparse(expr), "args": args})  # no Value left
        name = ast.Name(f"{_PROBE}{len(self.probes) - 1}", ast.Load())
        return ast.copy_location(name, node)

    def _send(self, node: ast.AST, args: dict[str, Any]) -> Any:
        """``node`` with each part that does not depend on the solution replaced by a name
        whose value (computed here) ``args`` holds: the sandbox evaluates none of it, so
        nothing the solution rigs changes what its functions are called with."""
        for field, value in ast.iter_fields(node):
            if field == "format_spec":  # part of an f-string's syntax, not a value
                continue
            if isinstance(value, list):
                setattr(node, field, [self._sent(v, args) for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field, self._sent(value, args))
        return node

    def _sent(self, node: Any, args: dict[str, Any]) -> Any:
        if not isinstance(node, ast.expr) or isinstance(node, ast.FormattedValue):
            return self._send(node, args) if isinstance(node, ast.AST) else node
        name = name_of(node)
        if type(node) is ast.Constant or name in CALLS or name in CONSTANTS:
            return node  # a literal, or a builtin passed as a function (key=abs)
        if _depends(node, frozenset()):
            return self._send(node, args)
        try:
            check(node)
            encoded = encode(Interpreter({}).run(node))
        except Exception:  # not a plain value (a lambda, say): the solution's own input
            return self._send(node, args)
        args[f"{_ARG}{self.args}"] = encoded
        self.args += 1
        return ast.copy_location(ast.Name(f"{_ARG}{self.args - 1}", ast.Load()), node)


def _owned(node: ast.expr) -> bool:
    """Whether ``node`` names something of the solution's: a name that is neither a builtin
    (``pow``) nor a standard module read through an attribute (``re.split``, ``math.comb``)."""
    modules = {
        n.value.id
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        if n.value.id in sys.stdlib_module_names
    }
    local = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    local |= {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - local
    return bool(names - _BUILTINS - modules)


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
            tests.append(split.visit(_ClassAsType().visit(stmt.test)))
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{where}: {exc}", status=422) from None
    return Judged(source, tuple(split.probes), tuple(tests))
