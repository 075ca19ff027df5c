"""Client side of rollgym: pooled sessions, per-server retry policy, budget and breaker."""

from rollgym.http.client import HttpClient, Target, TargetStats

__all__ = ["HttpClient", "Target", "TargetStats"]
