"""``rollgym tasks``: make task files from a catalogue's generators (``tasks reasoning-gym``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollgym.cli.kit import PlainHelpCommand
from rollgym.errors import ConfigError

if TYPE_CHECKING:
    from rollgym.envs.reasoning_gym.tasks import DatasetChoice

REASONING_GYM_HELP = (
    "Write a task file of reasoning-gym rows, made offline and deterministically by seed: the "
    "same arguments on the same reasoning-gym version give the same file, byte for byte.\n\n"
    "Each row is NeMo Gym-shaped (responses_create_params with the prompt) and carries the "
    "entry its dataset scores (question, answer, metadata, reasoning_gym), for the "
    "reasoning_gym environment (impl: reasoning_gym). The prompt asks for the final answer "
    "between <answer> and </answer> tags, the convention the environment reads.\n\n"
    "Example: rollgym tasks reasoning-gym --dataset chain_sum:2 --dataset leg_counting:1 "
    "--config 'chain_sum={\"min_terms\": 3}' --size 200 --seed 0 --output tasks.jsonl"
)


def register(app: typer.Typer) -> None:
    tasks = typer.Typer(
        help="Make task files from a catalogue's dataset generators.",
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,  # plain, as every other command's help
    )
    app.add_typer(tasks, name="tasks")

    @tasks.command("reasoning-gym", cls=PlainHelpCommand, help=REASONING_GYM_HELP)
    def reasoning_gym(
        dataset: Annotated[
            list[str] | None,
            typer.Option(
                "--dataset",
                "-d",
                metavar="NAME[:WEIGHT]",
                help="A dataset by its registered name, with an optional weight: NAME or "
                "NAME:WEIGHT (repeatable; rows are split in proportion to the weights).",
            ),
        ] = None,
        config: Annotated[
            list[str] | None,
            typer.Option(
                "--config",
                "-c",
                metavar="NAME=JSON",
                help="Config overrides of one dataset: NAME=JSON_OBJECT, e.g. "
                "'chain_sum={\"min_terms\": 3}' (repeatable; keys are the fields of the "
                "dataset's config class).",
            ),
        ] = None,
        size: Annotated[int, typer.Option(min=1, help="Rows in the file.")] = 100,
        seed: Annotated[int, typer.Option(min=0, help="Seed of every dataset and the mix.")] = 0,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="The JSONL file to write.")
        ] = None,
        system_prompt: Annotated[
            bool,
            typer.Option(
                help="Start each prompt with a system message stating the <answer> convention."
            ),
        ] = True,
        scripted: Annotated[
            bool,
            typer.Option(
                help="Add a scripted-model script (the reference answer, a wrong one) and "
                "rollgym_check answers to each row that has a reference: for demos and tests "
                "with impl: scripted, which is no language model.",
            ),
        ] = False,
        agent: Annotated[
            str | None,
            typer.Option(
                help="Set each row's agent_ref.name: a run with several agents (and "
                "environments) routes each row to the agent it names."
            ),
        ] = None,
        list_: Annotated[
            bool, typer.Option("--list", help="List the datasets offered and exit.")
        ] = False,
    ) -> None:
        from rollgym.envs.reasoning_gym import guard
        from rollgym.envs.reasoning_gym import tasks as rg

        if list_:
            # Offered datasets only; the refused ones are named apart, with the reason.
            offered = rg.offered()
            typer.echo(f"reasoning-gym {rg.version()}: {len(offered)} datasets offered")
            for name in offered:
                typer.echo(name)
            for name, why in sorted(guard.BROKEN.items()):
                typer.echo(f"not offered: {name}: {why}", err=True)
            return
        if not dataset:
            raise ConfigError("--dataset: name at least one dataset (--list lists them)")
        if output is None:
            raise ConfigError("--output: name the task file to write")
        choices = _choices(dataset, config or [])
        prompt = rg.PROMPT if system_prompt else None
        written = rg.write_rows(
            output, choices, size, seed, prompt=prompt, scripted=scripted, agent=agent
        )
        mix = ", ".join(
            f"{c.name} {n}" for c, n in zip(choices, rg.counts(choices, size), strict=True)
        )
        print(f"wrote {written} rows to {output} ({mix})", file=sys.stderr)


def _choices(datasets: list[str], configs: list[str]) -> list[DatasetChoice]:
    from rollgym.envs.reasoning_gym.tasks import DatasetChoice, check_config, check_name

    overrides: dict[str, dict[str, object]] = {}
    for text in configs:
        name, sep, raw = text.partition("=")
        where = f"--config {text!r}"
        if not sep:
            raise ConfigError(f"{where}: expected NAME=JSON_OBJECT")
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a JSON object of config keys")
        overrides.setdefault(name.strip(), {}).update(value)
    choices: list[DatasetChoice] = []
    for text in datasets:
        name, sep, raw = text.partition(":")
        name = name.strip()
        where = f"--dataset {text!r}"
        check_name(name, where)
        try:
            weight = float(raw) if sep else 1.0
        except ValueError:
            raise ConfigError(f"{where}: weight {raw!r} is not a number") from None
        if not weight > 0 or weight == float("inf"):
            raise ConfigError(f"{where}: weight must be a positive number")
        if any(c.name == name for c in choices):
            raise ConfigError(f"{where}: {name} is named twice")
        config = overrides.pop(name, {})
        check_config(name, config, f"--config {name}")
        choices.append(DatasetChoice(name, weight, config))
    for name in overrides:
        raise ConfigError(f"--config {name}=...: {name} is not one of the --dataset names")
    return choices
