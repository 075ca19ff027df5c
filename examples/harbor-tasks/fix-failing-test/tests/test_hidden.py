import sys

sys.path.insert(0, "/app")

from calc import add, mean  # noqa: E402


def test_mean():
    assert mean([1, 2, 3, 6]) == 3
    assert mean([5]) == 5
    assert mean([1.5, 2.5]) == 2.0


def test_add_still_works():
    assert add(-1, 1) == 0
