"""Math answers checked symbolically with math-verify (``1/2``, ``0.5`` and ``\\frac{1}{2}`` agree),
scored as NeMo Gym 0.4.0's ``math_with_judge`` scores them with its judge off."""
