"""``rollgym run TASKS_DIR``: a directory of Harbor tasks run with no config file
(``rollgym.harbor.runconfig``), recorded like any other run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollgym.cli.kit import CollectOptions, collect_config, recorded_inputs

if TYPE_CHECKING:
    from rollgym.config import CollectConfig, Config

ModelUrlOpt = Annotated[
    str | None,
    typer.Option(
        help="With a TASKS_DIR and --agent terminal: the model, an OpenAI-compatible endpoint "
        "(e.g. vLLM's http://host:8000/v1) put behind rollgym's openai_proxy."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(help="With --model-url: the model name sent upstream (default: none sent)."),
]


def harbor_inputs(
    tasks_dir: Path, output: Path, options: CollectOptions, model_url: str | None,
    model: str | None,
) -> tuple[Config, CollectConfig, Path]:  # fmt: skip
    """The config, collect section and input rows of a run of ``tasks_dir``."""
    from rollgym.config import parse_config
    from rollgym.harbor.runconfig import INPUT_NAME, harbor_config, write_rows

    data = harbor_config(tasks_dir, options.agent, model_url=model_url, model=model)
    cfg = parse_config(data, source=str(Path(tasks_dir).absolute() / "task-directory"))
    recorded = recorded_inputs(output, options.resume)
    if recorded is not None and recorded.input is not None:
        input_path = recorded.input
    elif options.input is not None:
        input_path = options.input
    else:
        input_path = write_rows(tasks_dir, output / INPUT_NAME)
    overrides = {**options.overrides(), "agent": data["collect"]["agent"]}
    return cfg, collect_config(cfg, recorded, **overrides), input_path
