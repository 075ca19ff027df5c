"""A trivial environment for benchmarks and tests: one tool that echoes its argument."""
