"""rollgym's tests: a package, so server processes can import test-only servers as ``tests.*``."""
