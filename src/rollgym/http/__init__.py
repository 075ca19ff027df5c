"""Client side of rollgym: pooled sessions, per-server retry policy, budget and breaker."""

from rollgym.http.answer import JsonValue
from rollgym.http.client import HttpClient, Target, TargetStats
from rollgym.http.lean import LeanTransport
from rollgym.http.transport import AiohttpTransport, RawAnswer, Transport

__all__ = [
    "AiohttpTransport",
    "HttpClient",
    "JsonValue",
    "LeanTransport",
    "RawAnswer",
    "Target",
    "TargetStats",
    "Transport",
]
