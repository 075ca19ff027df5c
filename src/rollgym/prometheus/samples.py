"""What a server adds to its ``/metrics`` beyond what every server has: plain records, so a
server reports its own numbers without importing ``prometheus_client``.

A server that has numbers of its own implements ``Exported`` (``exported()``); its
``/metrics`` then carries them: the code environment's sandbox slots, the agent's per-hop
latency.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rollgym.prometheus.latency import LatencyByName


@dataclass(frozen=True, slots=True)
class GaugeSample:
    """One value of gauge ``name`` (without the ``rollgym_`` prefix), with its labels."""

    name: str
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """Histogram ``name`` (without the ``rollgym_`` prefix) of ``latency``, one series per
    name it holds, under label ``label``."""

    name: str
    help: str
    label: str
    latency: LatencyByName


Sample = GaugeSample | HistogramSample


@runtime_checkable
class Exported(Protocol):
    """A server with numbers of its own for ``/metrics``."""

    def exported(self) -> Iterable[Sample]: ...
