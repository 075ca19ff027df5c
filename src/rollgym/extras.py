"""The optional extras of pyproject.toml, the packages each brings, and the one command that
installs an extra. Every "install the extra" hint is made here, so each names the exact command;
callers print it as plain text (rich's markup would read ``[metrics]`` as a style tag)."""

from __future__ import annotations

# Top-level module -> the extra that installs it (pyproject.toml's optional-dependencies).
EXTRA_OF_MODULE = {
    "prometheus_client": "metrics",
    "ray": "ray",
    "torch": "train",
    "transformers": "train",
    "trl": "train",
    "opentelemetry": "trace",
    "openenv": "openenv",
    "reasoning_gym": "reasoning-gym",
}

# Extra -> what needs it, in a few words (`rollgym --help` fits it in 80 columns).
NEEDED_BY = {
    "metrics": "/metrics, run --metrics-port",
    "ray": "run --ray",
    "train": "serve-model, the TRL bridge",
    "trace": "traces: OTEL_TRACES_EXPORTER=otlp",
    "openenv": "serve-openenv, impl: openenv",
    "reasoning-gym": "tasks reasoning-gym, its environment",
}


def install_command(extra: str) -> str:
    """``pip install 'rollgym[EXTRA]'``: quoted, since a shell would read the brackets as a
    glob."""
    return f"pip install 'rollgym[{extra}]'"


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name is read by its top package), if any."""
    if not module:
        return None
    return EXTRA_OF_MODULE.get(module.split(".")[0])


def missing_hint(exc: ImportError) -> str:
    """What to run for a failed import: the extra's install command when an extra brings the
    missing module, else a plain "install NAME"."""
    extra = extra_for(exc.name)
    if extra is not None:
        return install_command(extra)
    return f"install {exc.name}" if exc.name else "install what it needs"


def extras_help() -> str:
    """The extras as a block of ``rollgym --help`` (click keeps a ``\\b`` paragraph as is)."""
    width = max(len(install_command(extra)) for extra in NEEDED_BY)
    rows = [f"  {install_command(e):<{width}}  {what}" for e, what in NEEDED_BY.items()]
    return "\b\nOptional extras (the core runs everything else):\n" + "\n".join(rows)
