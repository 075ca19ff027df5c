"""Guess the number: a multi-turn environment served Gymnasium-style (``/reset`` + ``/step``)."""
