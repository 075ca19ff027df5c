"""Assert rows of every shape HumanEval/MBPP-style tasks use, through the real code server: an
honest solution scores 1.0, and neither forgery does. Before, every expected side that was not
a literal (a slice, a comprehension, a join, an f-string, a method call, ``{...}.keys()``) was
evaluated inside the sandbox, so a solution that rigged ``builtins.eval`` at import, or wrote
its own report on the control pipe and exited, made both sides agree and scored 1.0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from rollgym.envs.code.asserts import parse_assert
from rollgym.envs.code.codec import MAX_BITS, MAX_COLLISIONS, Decoder, HashBudget, encode
from rollgym.envs.code.server import CodeEnv
from rollgym.errors import InvalidRequest
from rollgym.testing import serve_server
from tests.adversarial.test_code import LIMITS, row, solution, verify
from tests.envs.env_client import EnvClient

pytestmark = pytest.mark.timeout(120)

# name: (the assert, an honest solution)
SHAPES: dict[str, tuple[str, str]] = {
    "literal": ("assert rev('hello') == 'olleh'", "def rev(s):\n    return s[::-1]\n"),
    "slice": ("assert rev('hello') == 'hello'[::-1]", "def rev(s):\n    return s[::-1]\n"),
    "comprehension": (
        "assert squares(4) == [i * i for i in range(4)]",
        "def squares(n):\n    return [i * i for i in range(n)]\n",
    ),
    "join": (
        "assert dashed(['a', 'b', 'c']) == '-'.join(['a', 'b', 'c'])",
        "def dashed(xs):\n    return '-'.join(xs)\n",
    ),
    "f-string": (
        "assert greet('Bob') == f\"Hello, {'bob'.title()}! {2 * 3:>3}\"",
        "def greet(name):\n    return f'Hello, {name}!   6'\n",
    ),
    "method call": (
        "assert shout('hi there') == 'hi there'.upper()",
        "def shout(s):\n    return s.upper()\n",
    ),
    "dict keys": (
        "assert key_set({'a': 1, 'b': 2}) == {'a': 1, 'b': 2}.keys()",
        "def key_set(d):\n    return set(d)\n",
    ),
    "nested lists and dicts": (
        "assert group([1, 2, 3, 4]) == {'even': [2, 4], 'odd': [1, 3]}",
        "def group(xs):\n    return {'even': [x for x in xs if x % 2 == 0],"
        " 'odd': [x for x in xs if x % 2]}\n",
    ),
    "float isclose": (
        "assert math.isclose(area(2), 12.566370614359172, rel_tol=1e-9)",
        "import math\ndef area(r):\n    return math.pi * r * r\n",
    ),
    "set of result": (
        "assert set(uniq([3, 1, 3, 2])) == set([1, 2, 3])",
        "def uniq(xs):\n    return list(dict.fromkeys(xs))\n",
    ),
    "abs difference": (
        "assert abs(mean([1, 2, 6]) - 3.0) < 1e-6",
        "def mean(xs):\n    return sum(xs) / len(xs)\n",
    ),
    "sorted expected": (
        "assert sort_desc([3, 1, 2]) == sorted([3, 1, 2], reverse=True)",
        "def sort_desc(xs):\n    return sorted(xs, reverse=True)\n",
    ),
    "split expected": (
        "assert words('a b  c') == 'a b  c'.split()",
        "def words(s):\n    return s.split()\n",
    ),
    "all over a range": (
        "assert all(is_even(n) == (n % 2 == 0) for n in range(6))",
        "def is_even(n):\n    return n % 2 == 0\n",
    ),
    "comprehension over the result": (
        "assert [len(w) for w in words('ab c')] == [2, 1]",
        "def words(s):\n    return s.split()\n",
    ),
    # Shapes an honest solution failed before (issue 36): a type judged, a dict's view in its
    # order, an integer past Python's str <-> int digit limit, pairs of which some share a
    # hash (hash(-1) == hash(-2), so (-1, j) and (-2, j) do too).
    "type of the result": ("assert type(add(1, 2)) == int", "def add(a, b):\n    return a + b\n"),
    "type is": ("assert type(pair(1)) is tuple", "def pair(x):\n    return (x, x)\n"),
    "__class__": ("assert add(1, 2).__class__ is int", "def add(a, b):\n    return a + b\n"),
    "keys in order": (
        "assert list(order({'e': 1, 'd': 2, 'c': 3, 'b': 4})) == ['e', 'd', 'c', 'b']",
        "def order(d):\n    return d.keys()\n",
    ),
    "keys as a set": (
        "assert order({'b': 1, 'a': 2}) == {'a', 'b'}",
        "def order(d):\n    return d.keys()\n",
    ),
    "items in order": (
        "assert list(pairs({'e': 1, 'd': 2, 'c': 3})) == [('e', 1), ('d', 2), ('c', 3)]",
        "def pairs(d):\n    return d.items()\n",
    ),
    "a big integer": (
        "assert fact(2000) % 10 == 0",
        "import math\ndef fact(n):\n    return math.factorial(n)\n",
    ),
    "pairs sharing hashes": (
        "assert set(map(tuple, grid(30))) == {(i, j) for i in range(-30, 30) for j in range(-30, 30)}",
        "def grid(n):\n    return [[i, j] for i in range(-n, n) for j in range(-n, n)]\n",
    ),
}

# The functions answer nothing right: they return [] (what the forgeries make the other side).
WRONG = "def {name}(*args, **kwargs):\n    return []\n"
RIG_BUILTINS = (
    "import builtins, math\n"
    "def _agree(*args, **kwargs):\n    return []\n"
    "for _name in ('eval', 'sorted', 'abs', 'range', 'all', 'any', 'map', 'sum', 'min', 'max',"
    " 'round', 'len'):\n"
    "    setattr(builtins, _name, _agree)\n"
    "math.isclose = math.fabs = lambda *args, **kwargs: True\n"
)
# As many "[]" values as the harness asks for (read from its frames), written on every
# descriptor that takes them (the control pipe among them), then an exit before the harness
# can write its own report.
FORGE_REPORT = (
    "import json, os, sys\n"
    "_n, _frame = 1, sys._getframe()\n"
    "while _frame is not None:\n"
    "    if isinstance(_frame.f_locals.get('probes'), list):\n"
    "        _n = len(_frame.f_locals['probes'])\n"
    "    _frame = _frame.f_back\n"
    "_line = b'\\n' + json.dumps([['ok', ['l', []]]] * _n).encode() + b'\\n'\n"
    "for _fd in range(3, 64):\n"
    "    try:\n        os.write(_fd, _line)\n"
    "    except OSError:\n        pass\n"
    "os._exit(0)\n"
)


def _names(source: str) -> list[str]:
    return [line[4:].split("(")[0] for line in source.splitlines() if line.startswith("def ")]


def _wrong(honest: str) -> str:
    return "".join(WRONG.format(name=name) for name in _names(honest))


@pytest.fixture
async def code_env(connect: Callable[[str], EnvClient]) -> AsyncIterator[EnvClient]:
    async with serve_server(CodeEnv, name="code", options=LIMITS) as (url, _):
        yield connect(url)


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_an_honest_solution_passes_every_assert_shape(
    code_env: EnvClient, shape: str
) -> None:
    source, honest = SHAPES[shape]
    result = await verify(code_env, row(asserts=[source]), honest)
    assert result["reward"] == 1.0 and result["test_results"] == ["passed"], result


@pytest.mark.parametrize("forgery", ["rigged builtins", "forged report"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_no_forgery_passes_an_assert_shape(
    code_env: EnvClient, shape: str, forgery: str
) -> None:
    source, honest = SHAPES[shape]
    program = _wrong(honest) + (RIG_BUILTINS if forgery == "rigged builtins" else FORGE_REPORT)
    result = await verify(code_env, row(asserts=[source]), program)
    assert result["reward"] == 0.0, result
    assert result["test_results"][0] in ("wrong_answer", "runtime_error"), result


async def test_a_part_the_server_cannot_compute_is_refused_naming_it(
    code_env: EnvClient,
) -> None:
    # Never sent into the sandbox to be computed there, where the solution could rig it.
    for source, part in [
        ("assert f(1) == 'a\\tb'.expandtabs()", "'a\\\\tb'.expandtabs()"),
        ("assert f(1) == [f(i) for i in f(2)]", "which the solution gives"),
        ("assert f(1) == sorted([2, 1], key=lambda v: -v)", "lambda"),
        ("assert f(1) == pow(2, 10)", "'pow(2, 10)' uses only builtins or library modules"),
        ("assert f(1) == re.split(',', 'a,b')", "re.split"),
    ]:
        status, body = await code_env.verify(row(asserts=[source]), solution("def f(x): return x"))
        assert status == 422, body
        assert part in body["error"]["message"], body


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_sandbox_is_asked_only_for_the_solutions_calls(shape: str) -> None:
    source, honest = SHAPES[shape]
    judged = parse_assert(source, "asserts[0]")
    names = tuple(f"{name}(" for name in _names(honest))
    assert judged.probes and all(p["expr"].startswith(names) for p in judged.probes), judged


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("assert '-'.join(f(1)) == 'x'", ["a" * 100] * 100_000),  # 10 MB joined
        ("assert round(5, f(1)) == 0", -(10**9)),  # 10 ** 10 ** 9
        ("assert f(1).replace('a', 'b' * 1000) == 'x'", "a" * 100_000),
        ("assert [x * 1000 for x in f(1)] == []", ["a" * 1000] * 10_000),
        ("assert f(1).encode('punycode') == b''", "a"),  # a codec that can take quadratic time
        ("assert f(1).format(1) == ''", "{0.__class__}"),  # attributes of the server's values
        ("assert f(1) == f'{3:>99999999}'", "x"),
        ("assert sum(f(1), []) == []", [[1]] * 10),  # quadratic copying
    ],
)
def test_a_judgement_over_the_solutions_values_stays_bounded(source: str, value: object) -> None:
    held, why = parse_assert(source, "asserts[0]").judge([value])
    assert not held and why in ("the assertion raised ValueError", "the assertion raised TypeError")


def _colliding_pairs(count: int) -> list[list[int]]:
    """``count`` pairs ``[a, b]`` whose tuples share one hash: CPython's tuple hash (xxHash's
    round) inverted for the second item, whose hash is the integer itself below 2**61 - 1."""
    mask, p1, p2, p5 = 2**64 - 1, 11400714785074694791, 14029467366897019727, 2870177450012600261

    def first_round(h: int) -> int:
        acc = (p5 + h * p2) & mask
        return (((acc << 31) | (acc >> 33)) & mask) * p1 & mask

    pairs = []
    a = 1
    while len(pairs) < count:
        a += 1
        b = ((12345 - first_round(a)) * pow(p2, -1, 2**64)) & mask
        if 0 < b < 2**61 - 1:
            pairs.append([a, b])
    assert len({hash(tuple(p)) for p in pairs}) == 1  # CPython's hash, which this inverts
    return pairs


@pytest.mark.parametrize(
    "source",
    [
        "assert set(map(tuple, f(3))) == {(1, 2)}",  # the review's: 15,000 pairs took 3.3 s
        "assert {tuple(p) for p in f(3)} == {(1, 2)}",
        "assert len(dict([(tuple(p), 0) for p in f(3)])) == 1",
        "assert all(tuple(p) in {(1, 2)} | set(map(tuple, f(3))) for p in [[1, 2]])",
    ],
)
def test_keys_the_judgement_builds_cannot_be_chosen_to_collide(source: str) -> None:
    # Before, only decoded values were counted: tuples the server's interpreter built itself
    # went into a set unchecked, n * n / 2 comparisons. 2,000 pairs keep this quick either way.
    held, why = parse_assert(source, "asserts[0]").judge([_colliding_pairs(2000)])
    assert not held and why == "the assertion raised ValueError", why


def test_hash_clashes_are_counted_in_comparisons_not_seconds() -> None:
    pairs = [tuple(p) for p in _colliding_pairs(2000)]
    budget = HashBudget()
    with pytest.raises(ValueError, match="collide"):
        budget.admit(pairs)
    # Stopped at the budget: about MAX_COLLISIONS comparisons (each weighted by the tuple's
    # length), where building the set would have made 2,000 * 2,000 / 2.
    assert MAX_COLLISIONS < budget.compared <= MAX_COLLISIONS + 3 * len(pairs)
    honest = HashBudget()
    honest.admit([(i, j) for i in range(-300, 300) for j in range(-300, 300)])  # 360,000 keys
    assert honest.compared < 5000  # (-1, j) and (-2, j) share a hash: one comparison each


def test_a_dict_view_reported_keeps_its_order_and_its_set_comparison() -> None:
    # A keys view went as a set before: in no particular order, so list(f()) failed.
    view = Decoder().decode(encode({"b": 1, "a": 2, "c": 3}.keys()))
    assert list(view) == ["b", "a", "c"] and view == {"a", "b", "c"} and view != ["b", "a", "c"]
    items = Decoder().decode(encode({"b": [1], "a": [2]}.items()))
    assert list(items) == [("b", [1]), ("a", [2])]
    # A forged view with a key twice claims no more than a dict's view: the key once.
    assert list(Decoder().decode(["K", [["s", "a"], ["s", "a"]]])) == ["a"]


def test_integers_cross_as_hex_up_to_the_bit_cap() -> None:
    big = 7**9000  # 7,606 digits: past Python's 4,300-digit limit for str <-> int
    assert Decoder().decode(encode(big)) == big
    with pytest.raises(ValueError, match="bits"):
        encode(1 << MAX_BITS)
    with pytest.raises(ValueError, match="bits"):
        Decoder().decode(["i", "f" * (MAX_BITS // 4 + 3)])


def test_a_humaneval_check_function_is_refused_naming_why() -> None:
    source = "def check(candidate):\n    assert candidate(1) == 1\n\ncheck(f)\n"
    with pytest.raises(InvalidRequest, match="not an assert statement"):
        parse_assert(source, "asserts[0]")
