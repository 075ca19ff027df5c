"""A tracer provider configured from the standard OpenTelemetry variables.

This is what the SDK's own auto-configuration (``opentelemetry-instrument``, the distro) does
for traces, written here with the SDK's public pieces rather than its private module:

- ``OTEL_TRACES_EXPORTER``: comma-separated exporter names, each an entry point of the group
  ``opentelemetry_traces_exporter`` (``otlp``, ``otlp_proto_http``, ``otlp_proto_grpc``,
  ``console``, or any installed exporter's). ``otlp`` is gRPC unless
  ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``http/protobuf``
  (as the Python SDK decides it).
- Each exporter reads its own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``..._HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``).
- ``TracerProvider`` reads the sampler (``OTEL_TRACES_SAMPLER``, ``..._ARG``) and the span limits;
  ``BatchSpanProcessor`` its ``OTEL_BSP_*`` settings; ``Resource.create`` reads
  ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``.

The provider flushes and shuts down at the process's exit (the SDK's own ``atexit``).
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from rollgym.errors import ConfigError

__all__ = ["exporter_classes", "make_global", "provider_from_env"]

_GROUP = "opentelemetry_traces_exporter"
_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def exporter_classes(environ: dict[str, str] | None = None) -> list[type[SpanExporter]]:
    """The exporter classes ``OTEL_TRACES_EXPORTER`` names; ``ConfigError`` naming the
    variable for a name no installed package provides."""
    env = os.environ if environ is None else environ
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip() for n in raw.split(",") if n.strip() and n.strip().lower() != "none"]
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    found = entry_points(group=_GROUP)
    classes: list[type[SpanExporter]] = []
    for name in names:
        if name == "otlp":
            name = _BY_PROTOCOL.get((protocol or "grpc").strip(), "")
            if not name:
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: not an OTLP protocol for "
                    f"traces (one of {sorted(_BY_PROTOCOL)})"
                )
        match = [ep for ep in found if ep.name == name]
        if not match:
            known = sorted({ep.name for ep in found})
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={raw!r}: no installed exporter is named {name!r} "
                f"(installed: {', '.join(known) or 'none'})"
            )
        cls = match[0].load()
        if not (isinstance(cls, type) and issubclass(cls, SpanExporter)):
            raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not a span exporter")
        classes.append(cls)
    return classes


def provider_from_env(service: str) -> TracerProvider:
    """A provider exporting (in batches) to every exporter the environment names, for
    ``service`` unless the environment names the service."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    for cls in exporter_classes():
        provider.add_span_processor(BatchSpanProcessor(cls()))
    return provider


def make_global(provider: TracerProvider) -> None:
    """Make ``provider`` OpenTelemetry's global one if the process has none yet, so libraries
    that trace too (in a custom server's code) join the same traces."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
