"""The Ray tests: skipped as a whole where Ray is not installed.

This directory has no ``__init__.py`` on purpose: as a package it could shadow ``ray`` itself.
Its fixtures (the local cluster) are in ``tests/conftest.py``, its helpers in ``tests.support``.
"""

import pytest

pytest.importorskip("ray")
