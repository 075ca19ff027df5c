"""Replies scored by an LLM judge: equivalence with a gold answer, or a rubric."""
