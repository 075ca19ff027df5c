"""Math answers checked symbolically with math-verify (``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree)."""
