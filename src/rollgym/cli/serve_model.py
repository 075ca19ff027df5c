"""``rollgym serve-model``: serve a local model directory on the CPU (tests and debugging)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rollgym.cli.kit import PlainHelpCommand

HELP = (
    "Serve MODEL_DIR (a save_pretrained directory: weights and a tokenizer with a chat "
    "template) on the CPU with transformers, through the model-server contract rollgym uses "
    "for vLLM: POST /v1/chat/completions and /v1/responses with vLLM-shaped token ids and "
    "logprobs, POST /tokenize, GET /v1/models, GET /health, and POST /rollgym/weights to load "
    "a trainer's new weights (with the control token, like /rollgym/pause and /resume: "
    "ROLLGYM_CONTROL_TOKEN, else the file ROLLGYM_CONTROL_TOKEN_FILE names, by default "
    "~/.local/state/rollgym/control-token, created mode 0600; rollgym's clients send it "
    "themselves). FOR TESTS AND DEBUGGING, NOT THROUGHPUT: one generation at a "
    "time, a small queue (503 when full), no batching."
)


def register(app: typer.Typer) -> None:
    @app.command(name="serve-model", cls=PlainHelpCommand, help=HELP)
    def serve_model(
        model_dir: Annotated[Path, typer.Argument(help="The model directory.")],
        host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (0: a free one).")] = 0,
        write_url: Annotated[
            Path | None, typer.Option(help="Write the server's URL here once it listens.")
        ] = None,
        served_model_name: Annotated[
            str | None, typer.Option(help="Name in /v1/models (default: the folder's).")
        ] = None,
        max_tokens_cap: Annotated[int, typer.Option(help="Largest max_tokens taken.")] = 512,
        max_model_len: Annotated[
            int | None, typer.Option(help="Context length (default: the model's).")
        ] = None,
        max_queue: Annotated[
            int, typer.Option(help="Requests that may wait behind the running one.")
        ] = 4,
        request_timeout: Annotated[
            float, typer.Option(help="Seconds per request, waiting included.")
        ] = 120.0,
        policy_version: Annotated[int, typer.Option(help="Weights version at start.")] = 0,
        weights_root: Annotated[
            Path | None,
            typer.Option(
                help="Pushes may load only checkpoints under this directory (default: the "
                "directory holding MODEL_DIR)."
            ),
        ] = None,
        threads: Annotated[int, typer.Option(help="torch CPU threads.")] = 1,
        log_level: Annotated[str, typer.Option(help="Log level.")] = "WARNING",
    ) -> None:
        from rollgym.cli.kit import setup_logging

        setup_logging(log_level)
        options: dict[str, Any] = {
            "model_dir": str(model_dir),
            "served_model_name": served_model_name,
            "max_tokens_cap": max_tokens_cap,
            "max_model_len": max_model_len,
            "max_queue": max_queue,
            "request_timeout": request_timeout,
            "policy_version": policy_version,
            "threads": threads,
            "weights_root": None if weights_root is None else str(weights_root),
        }
        serve(options, host=host, port=port, write_url=write_url, log_level=log_level)


def serve(
    options: dict[str, Any], *, host: str, port: int, write_url: Path | None, log_level: str
) -> None:
    """Serve ``rollgym.models.local:LocalModel`` with ``options`` until SIGINT/SIGTERM."""
    import asyncio
    import os

    import uvicorn

    from rollgym.config import ServerConfig
    from rollgym.control_token import ENV_TOKEN, control_token, token_file
    from rollgym.errors import ConfigError
    from rollgym.launch.ports import bind_socket
    from rollgym.models.local import LocalModel
    from rollgym.server.app import build_app
    from rollgym.server.base import ServerContext
    from rollgym.server.headers import limited_http

    if not Path(options["model_dir"]).is_dir():
        raise ConfigError(f"{options['model_dir']}: not a directory")
    config = ServerConfig.model_validate(
        {"kind": "model", "impl": "rollgym.models.local:LocalModel", "options": options}
    )
    server = LocalModel(ServerContext(name="model", config=config))
    control_token()  # created now, so a trainer started next finds it
    token_from = ENV_TOKEN if os.environ.get(ENV_TOKEN) else str(token_file())
    sock = bind_socket(host, port)
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    uv = uvicorn.Server(
        uvicorn.Config(
            build_app(server),
            log_level=log_level.lower(),
            access_log=False,
            http=limited_http(config.limits, "model"),
            timeout_graceful_shutdown=5,
        )
    )

    def announce() -> None:
        if write_url is not None:
            write_url.write_text(url + "\n")
        typer.echo(f"serving {options['model_dir']} at {url} (tests and debugging)")
        typer.echo(
            f"weight pushes: checkpoints under {server.weights_root}, with the control token "
            f"of {token_from}"
        )

    async def main() -> None:
        serving = asyncio.create_task(uv.serve(sockets=[sock]))
        # uvicorn says it listens only by a flag.
        while not uv.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if uv.started:
            announce()
        await serving

    try:
        asyncio.run(main())
    finally:
        sock.close()
