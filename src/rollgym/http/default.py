"""The one place that builds the transport every rollgym client uses unless given another."""

from __future__ import annotations

import rollgym.http.limits as answer_limits
from rollgym.config import AnswerLimits
from rollgym.http.aiohttp_transport import AiohttpTransport
from rollgym.http.lean import LeanTransport


def default_transport(
    *,
    limit: int = 8192,
    keepalive_timeout: float = 30.0,
    limits: AnswerLimits = answer_limits.DEFAULT_LIMITS,
) -> LeanTransport:
    """``LeanTransport`` for plain ``http://``, with ``AiohttpTransport`` as its fallback for
    ``https://`` and URLs with credentials; both with these pool settings (``limit``
    connections per server, 0: none; idle ones kept ``keepalive_timeout`` seconds) and answer
    limits (for attempts sent without a client's). The aiohttp session, and aiohttp itself,
    are made only when a first such URL is called."""
    fallback = AiohttpTransport(limit=limit, keepalive_timeout=keepalive_timeout, limits=limits)
    return LeanTransport(
        limit=limit, keepalive_timeout=keepalive_timeout, limits=limits, fallback=fallback
    )
