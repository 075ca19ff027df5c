"""Fixtures of the tracing tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.traced_run import ChatUpstream, upstream_served


@pytest.fixture
def upstream_url() -> Iterator[tuple[str, ChatUpstream]]:
    """A chat-completions upstream on a thread of this process: (its URL, itself)."""
    with upstream_served() as served:
        yield served
