"""Fixtures of the environment tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from .env_client import EnvClient


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[str], EnvClient]]:
    """``connect(url)``: an ``EnvClient`` on one shared aiohttp session with explicit timeouts."""
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        yield lambda url: EnvClient(http, url)
