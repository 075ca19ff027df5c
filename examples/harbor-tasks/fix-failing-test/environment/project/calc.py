"""A tiny calculator."""


def add(a, b):
    return a + b


def mean(values):
    """The arithmetic mean of a non-empty list."""
    return sum(values) / (len(values) - 1)
