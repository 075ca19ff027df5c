"""``rollgym run`` (start servers, collect, stop) and ``rollgym collect`` (running servers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from rollgym.cli.args import http_url
from rollgym.cli.harbor import ModelOpt, ModelUrlOpt, harbor_inputs
from rollgym.cli.kit import (
    EXIT_CODES_HELP,
    CollectOptions,
    ConfigArg,
    OutputOpt,
    PlainHelpCommand,
    collect_inputs,
    collect_options,
    finish,
    guarded,
)
from rollgym.cli.kit import collect_config as _collect_config  # noqa: F401 (tests import it here)
from rollgym.errors import ConfigError
from rollgym.extras import install_command

if TYPE_CHECKING:
    from rollgym.collect import RunOutcome
    from rollgym.config import CollectConfig, Config


RayOpt = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Run on a Ray cluster: servers' replicas spread over its nodes, collection over "
        "worker actors, one output directory. Needs the ray extra: "
        f"{install_command('ray')}",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join (implies --ray). Default: $RAY_ADDRESS, else a new local Ray."
    ),
]
RayWorkersOpt = Annotated[
    int | None, typer.Option(min=1, help="Collect worker actors with --ray. Default: one per node.")
]
ServersOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--servers",
        "-s",
        help="Running servers: NAME=URL (repeatable), or the JSON file written by "
        "`rollgym serve --write-urls`. Default: the `url:` of each server in the config.",
    ),
]

RUN_HELP = (
    "Start the servers of CONFIG, collect rollouts of the input into --output, stop them.\n\n"
    "CONFIG may be a directory of Harbor tasks instead (task.toml, instruction.md, "
    "environment/Dockerfile, tests/test.sh, solution/solve.sh each), run with no config as "
    "`harbor run -p` does: --agent oracle (replays each solve.sh, the default), nop (does "
    "nothing) or terminal (a model: --model-url URL, an OpenAI-compatible endpoint such as "
    "vLLM's, and --model NAME), one rollout per task, in podman containers.\n\n"
    "Writes tasks.jsonl, rollouts.jsonl, failures.jsonl, metrics.json and run.json.\n\n"
    + EXIT_CODES_HELP
)
COLLECT_HELP = (
    "Collect against servers that are already running (one set of servers, many runs), with "
    "the same outputs as `run`.\n\n" + EXIT_CODES_HELP
)


async def _run(
    cfg: Config,
    collect: CollectConfig,
    input_path: Path,
    output: Path,
    options: CollectOptions,
    urls: dict[str, list[str]] | None,
) -> RunOutcome:
    """``run`` launches the config's servers; ``collect`` (``urls`` given) finds them running."""
    from rollgym.collect import RunAgents, local_launcher, run_collection
    from rollgym.collect.layout import RunDir
    from rollgym.dialects import ROW_DIALECTS, SERVER_DIALECTS

    # Pre-flight, before anything is written: the agent, then the servers (checked here when
    # launched, found reachable when running).
    agents = RunAgents.of(cfg, collect, options.agent)
    launcher = local_launcher(
        cfg, agents, urls=urls, log_dir=RunDir(output).logs, log_level=options.log_level
    )
    return await run_collection(
        cfg, collect, input_path, output, launcher, resume=options.resume, agents=agents,
        progress=options.progress, metrics_port=options.metrics_port,
        metrics_host=options.metrics_host, agent_dialects=SERVER_DIALECTS,
        dialects=ROW_DIALECTS,
    )  # fmt: skip


def _parse_servers(values: list[str]) -> dict[str, list[str]]:
    """``--servers`` values (NAME=URL, or a JSON file of NAME: URL or [URL, ...]) as name ->
    URLs; every URL checked here, so a typo fails before anything is written."""
    urls: dict[str, list[str]] = {}
    for value in values:
        if "=" in value:
            name, url = (part.strip() for part in value.split("=", 1))
            if not name:
                raise ConfigError(f"--servers {value}: expected NAME=URL (e.g. agent=http://...)")
            urls.setdefault(name, []).append(http_url(url, f"--servers {value}"))
            continue
        path = Path(value)
        if "://" in value and not path.exists():
            raise ConfigError(
                f"--servers {value}: name the server it is, as NAME=URL (e.g. agent={value})"
            )
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(
                f"--servers {value}: not NAME=URL nor a readable JSON file: {exc}"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"--servers {value}: expected a JSON object of NAME: URL(s)")
        for name, got in data.items():
            listed = [got] if isinstance(got, str) else got
            if not isinstance(listed, list) or not listed:
                raise ConfigError(
                    f"--servers {value}: {name}: expected a URL or a list of URLs, not {got!r}"
                )
            for url in listed:
                where = f"--servers {value}: {name}"
                if not isinstance(url, str):
                    raise ConfigError(f"{where}: {url!r} is not a URL")
                urls.setdefault(name, []).append(http_url(url, where))
    return urls


def _config_urls(cfg: Config) -> dict[str, list[str]]:
    """The ``url:`` of each server in the config, each checked naming its file and key."""
    return {
        name: [http_url(s.url, f"{cfg.source}: servers.{name}.url")]
        for name, s in cfg.servers.items()
        if s.url
    }


def register(app: typer.Typer) -> None:
    @app.command(cls=PlainHelpCommand, help=RUN_HELP)
    @collect_options
    def run(
        config: ConfigArg,
        output: OutputOpt,
        options: CollectOptions,
        ray: RayOpt = False,
        ray_address: RayAddressOpt = None,
        ray_workers: RayWorkersOpt = None,
        model_url: ModelUrlOpt = None,
        model: ModelOpt = None,
    ) -> None:
        from rollgym.cli.kit import setup_logging
        from rollgym.config import load_config

        setup_logging(options.log_level)
        if config.is_dir():  # a directory of Harbor tasks
            cfg, collect, input_path = harbor_inputs(config, output, options, model_url, model)
            job = _run(cfg, collect, input_path, output, options, None)
            finish(guarded(job, output))
            return
        if model_url is not None or model is not None:
            raise ConfigError("--model-url and --model go with a directory of Harbor tasks")
        cfg = load_config(config)
        _config_urls(cfg)  # a server given by url: checked before anything starts
        # Every impl imports, every option is valid: checked where the run's launcher is built
        # (rollgym.collect.launchers), before anything is written or started.
        collect, input_path = collect_inputs(cfg, output, options)
        if ray or ray_address is not None:
            try:
                from rollgym.ray import run_on_ray
            except ImportError as exc:
                raise ConfigError(
                    f"--ray needs Ray installed ({install_command('ray')}): {exc}"
                ) from None
            on_ray = run_on_ray(
                cfg, collect, input_path, output, resume=options.resume, agent=options.agent,
                address=ray_address, workers=ray_workers, progress=options.progress,
                log_level=options.log_level, metrics_port=options.metrics_port,
                metrics_host=options.metrics_host,
            )  # fmt: skip
            finish(guarded(on_ray, output, collects_here=False))
            return
        job = _run(cfg, collect, input_path, output, options, None)
        finish(guarded(job, output))

    @app.command(cls=PlainHelpCommand, help=COLLECT_HELP)
    @collect_options
    def collect(
        config: ConfigArg,
        output: OutputOpt,
        servers: ServersOpt = None,
        *,
        options: CollectOptions,
    ) -> None:
        from rollgym.cli.kit import setup_logging
        from rollgym.config import load_config

        setup_logging(options.log_level)
        cfg = load_config(config)
        urls = _config_urls(cfg)
        urls.update(_parse_servers(servers or []))
        collect_cfg, input_path = collect_inputs(cfg, output, options)
        job = _run(cfg, collect_cfg, input_path, output, options, urls)
        finish(guarded(job, output), "collect")
