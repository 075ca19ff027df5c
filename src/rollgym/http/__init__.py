"""Client side of rollgym: pooled sessions, per-server retry policy, budget and breaker."""

from rollgym.http.aiohttp_transport import AiohttpTransport
from rollgym.http.answer import JsonValue
from rollgym.http.client import HttpClient, Target, TargetStats
from rollgym.http.default import default_transport
from rollgym.http.lean import LeanTransport
from rollgym.http.transport import RawAnswer, Request, Transport

__all__ = [
    "AiohttpTransport",
    "HttpClient",
    "JsonValue",
    "LeanTransport",
    "RawAnswer",
    "Request",
    "Target",
    "TargetStats",
    "Transport",
    "default_transport",
]
