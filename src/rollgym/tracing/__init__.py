"""OpenTelemetry traces: one trace per rollout, across every process it crosses.

Off by default, and free when off: nothing here imports ``opentelemetry`` until tracing is
turned on, and every hook in the hot path is ``if tracing.active is not None`` (the HTTP
client's calls and attempts, the server app's POST endpoints, the rollout core).

Turned on by the standard variable ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ...; unset
or ``none``: off), read by ``setup()``, which every rollgym process calls at its start (each
server launched by ``rollgym run``/``serve``, the collector, Ray collect workers). The rest of
the exporter's configuration is the SDK's own reading of the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ...): ``rollgym.tracing.exporting``. A program that
configures OpenTelemetry itself (a trainer) calls ``enable()`` instead: rollgym's spans then go
to its global tracer provider (or the one it passes).

What a trace holds and how the context crosses processes: ``rollgym.tracing.spans``; the span
and attribute names: ``rollgym.tracing.names``.
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rollgym.errors import ConfigError
from rollgym.extras import install_command

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from rollgym.tracing.spans import Tracer

__all__ = [
    "TRACES_EXPORTER",
    "active",
    "disable",
    "enable",
    "flush",
    "requested",
    "setup",
    "span",
]

TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
"""The standard variable naming the span exporters; set (and not ``none``), tracing is on."""
SDK_DISABLED = "OTEL_SDK_DISABLED"
"""The standard variable that turns every OpenTelemetry SDK off (``true``)."""

active: Tracer | None = None
"""The tracer of this process, or ``None`` when tracing is off (the hooks' one check)."""

_lock = threading.Lock()


def requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: ``OTEL_TRACES_EXPORTER`` names an exporter and
    ``OTEL_SDK_DISABLED`` is not ``true``."""
    env = os.environ if environ is None else environ
    names = env.get(TRACES_EXPORTER, "").strip().lower()
    if not names or names == "none":
        return False
    return env.get(SDK_DISABLED, "").strip().lower() != "true"


def setup(service: str) -> bool:
    """Turn tracing on in this process if the environment asks for it (``requested()``), with
    the exporters the standard variables name; ``service`` is the service name unless
    ``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) gives one.
    Idempotent: a process already tracing keeps its tracer. Returns whether tracing is on.

    Raises ``ConfigError`` when traces are asked for but cannot be made (the ``trace`` extra is
    not installed, an exporter name is unknown): asked-for traces that silently never come would
    be found missing only when someone needs them."""
    global active
    if active is not None or not requested():
        return active is not None
    with _lock:
        if active is None:
            try:
                from rollgym.tracing.exporting import make_global, provider_from_env
                from rollgym.tracing.spans import Tracer
            except ImportError as exc:
                raise ConfigError(
                    f"{TRACES_EXPORTER}={os.environ.get(TRACES_EXPORTER)} asks for traces, but "
                    f"OpenTelemetry is not installed ({exc}): {install_command('trace')}, or "
                    f"unset {TRACES_EXPORTER}"
                ) from None
            provider = provider_from_env(service)
            make_global(provider)
            active = Tracer(provider)
    return True


def enable(provider: TracerProvider | None = None) -> Tracer:
    """Trace this process's rollouts and calls into ``provider`` (``None``: OpenTelemetry's
    global tracer provider, e.g. one a trainer configured); needs the ``trace`` extra."""
    global active
    from rollgym.tracing.spans import Tracer

    with _lock:
        active = Tracer(provider)
    return active


def flush(timeout: float = 5.0) -> None:
    """Export the spans this process still holds (at most ``timeout`` seconds); nothing when
    off. A server calls it as it stops: uvicorn ends its process by re-raising the SIGTERM it
    took, so the SDK's own exit hook never runs."""
    tracer = active
    if tracer is not None:
        tracer.flush(timeout)


def disable() -> None:
    """Stop tracing in this process (the provider is left as it is: its owner shuts it down)."""
    global active
    active = None


class _NoSpan(AbstractContextManager[None]):
    """The span of a block when tracing is off: nothing (``with span(...) as s``: ``s`` is
    ``None``)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


def span(name: str, attributes: dict[str, Any] | None = None) -> AbstractContextManager[Any]:
    """A span named ``name`` around a block, child of the current one; a shared no-op when
    tracing is off. For work measured in milliseconds (a sandbox run, a judge call, a circuit
    hold), where one function call is nothing: the per-request hooks use ``active`` inline."""
    tracer = active
    if tracer is None:
        return _NO_SPAN
    return tracer.span(name, attributes)
