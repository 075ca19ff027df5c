"""A scrape's answer: the families of one source rendered by ``prometheus_client``, in the text
format, or OpenMetrics when the scraper asks for it (Prometheus does, in ``Accept``).

Each source (a server, a collector) gets a registry of its own: a test process runs many
servers at once, and ``prometheus_client``'s global default registry would mix them up (or
refuse the second one's names). ``prometheus_client`` is imported at the first scrape, never at
start-up (``pip install 'rollgym[metrics]'``; without it ``/metrics`` answers 501 saying so).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from rollgym.errors import HTTPStatusError
from rollgym.extras import install_command

if TYPE_CHECKING:
    from prometheus_client.core import Metric

Families = Callable[[], Iterable["Metric"]]
"""Builds the metric families of one scrape. The function that describes a source lives with
the source (``rollgym.server.metrics``, ``rollgym.collect.metrics_port``, ``rollgym.ray.metrics``)
and imports its module, which imports ``prometheus_client``, when it is called."""

INSTALL_HINT = f"Prometheus metrics need prometheus_client: {install_command('metrics')}"
_MODULES = ("prometheus_client.exposition", "rollgym.prometheus.families")


class Exposition:
    """Renders the families of one source on each scrape, through a registry of its own;
    ``modules`` are those its ``families`` import (loaded by ``load``, off the event loop)."""

    def __init__(self, families: Families, modules: Sequence[str] = ()) -> None:
        self._families = families
        self._modules = (*_MODULES, *modules)
        self._registry: Any = None

    async def load(self) -> None:
        """Import ``prometheus_client`` (and the families built with it) in a thread, once:
        cold, it takes a third of a second, which the first scrape must not take from the event
        loop that serves rollouts. Missing, nothing happens here (``render`` says so)."""
        for name in self._modules:
            if name not in sys.modules:
                with contextlib.suppress(ImportError):
                    await asyncio.to_thread(importlib.import_module, name)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The body and content type of one scrape, in the format ``accept`` prefers."""
        try:
            from prometheus_client import CollectorRegistry
            from prometheus_client.exposition import choose_encoder
        except ImportError:
            raise HTTPStatusError(INSTALL_HINT, status=501) from None
        if self._registry is None:
            # auto_describe off: describing would build every family once more at register.
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Source(self._families))
            self._registry = registry
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self._registry), content_type


class _Source:
    """``prometheus_client``'s collector interface over a ``Families`` function."""

    def __init__(self, families: Families) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families()


def metrics_endpoint(exposition: Exposition) -> Callable[[Request], Any]:
    """A ``GET /metrics`` endpoint answering ``exposition`` (a server's: ``server.app``)."""

    async def metrics(request: Request) -> Response:
        await exposition.load()
        body, content_type = exposition.render(request.headers.get("accept"))
        return Response(body, media_type=None, headers={"content-type": content_type})

    return metrics
