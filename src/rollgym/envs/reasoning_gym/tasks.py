"""Task rows from reasoning-gym's datasets, made deterministically by seed.

``make_rows`` draws ``size`` rows from several datasets in proportion to their weights
(largest remainders, so the counts are exact and do not depend on chance), each dataset made
by reasoning-gym with the run's seed, then shuffles them with that seed. The same arguments on
the same installed version give the same rows, byte for byte (``dump_row``), in one process.
Across processes five datasets of 0.1.25 differ (isomorphic_strings, knight_swap,
polynomial_multiplication, ransom_note, word_ladder: they iterate sets of strings, whose order
follows the process's hash seed), so ``write_rows`` makes a file in a child process whose
``PYTHONHASHSEED`` is ``HASH_SEED``.

A row has the prompt in ``responses_create_params`` and carries the entry as NeMo Gym's
reasoning_gym rows do (``question``, ``answer``, ``metadata``), plus ``reasoning_gym``: the dataset,
the config overrides it was made with (its scorer is built with the same), the version that made it,
and the type patches that restore the entry exactly (``carry.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import multiprocessing
import os
import random
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from rollgym.envs.reasoning_gym import guard
from rollgym.envs.reasoning_gym.carry import NotCarried, carry
from rollgym.errors import ConfigError
from rollgym.extras import install_command

ROW_FIELD = "reasoning_gym"
WRONG_ANSWER = "<answer>I do not know</answer>"
PROMPT = (
    "Solve the problem, thinking step by step. Then give only the final answer, in the format "
    "the problem asks for, between <answer> and </answer> tags, e.g. <answer>42</answer>."
)
"""The convention the environment reads answers by: the last <answer> block
(reasoning-gym's own ``extract_answer``)."""
RUN_OWNED = frozenset({"size", "seed"})
"""Config keys the command itself sets (--size, --seed)."""


@dataclass(frozen=True)
class DatasetChoice:
    """One dataset of a task file: its registered name, weight and config overrides."""

    name: str
    weight: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)


@cache
def registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registered datasets: name -> (dataset class, config class)."""
    try:
        import reasoning_gym  # noqa: F401 (registers the datasets)
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise ConfigError(
            f"reasoning-gym is not installed ({exc}): {install_command('reasoning-gym')}"
        ) from None
    # composite mixes other datasets by its own config; DatasetChoice weights do that here.
    return {name: pair for name, pair in DATASETS.items() if name != "composite"}


def offered() -> list[str]:
    """The datasets rows can be made of, sorted: every registered one but those whose scorer
    measures nothing (``guard.BROKEN``). The one count the docs and ``--list`` state."""
    return sorted(name for name in registry() if name not in guard.BROKEN)


@cache
def reads_config(name: str) -> bool:
    """Whether ``name``'s ``score_answer``, or a method of its own it calls, reads the
    dataset's config (``self.config``): then a row is scored right only by a scorer built with
    the config the row was made with. Read from the installed source (0.1.25: puzzle24,
    time_intervals, decimal_arithmetic, polynomial_equations); unreadable source counts as
    reading it."""
    cls: Any = registry()[name][0]
    try:
        source = inspect.getsource(cls.score_answer)
        called = [getattr(cls, m, None) for m in re.findall(r"self\.(\w+)\(", source)]
        sources = [source] + [inspect.getsource(f) for f in called if inspect.isfunction(f)]
    except (OSError, TypeError):
        return True
    return any("self.config" in text for text in sources)


@cache
def version() -> str:
    from importlib.metadata import version as installed

    return installed("reasoning-gym")


def check_name(name: str, where: str) -> None:
    """``name`` is a registered dataset; else a ``ConfigError`` suggesting the nearest."""
    names = registry()
    if name in guard.BROKEN:
        raise ConfigError(f"{where}: {name} is not offered: {guard.BROKEN[name]}")
    if name in names:
        return
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ConfigError(
        f"{where}: {name!r} is not a reasoning-gym dataset{hint} "
        f"({len(offered())} are offered; `rollgym tasks reasoning-gym --list` lists them)"
    )


def check_config(name: str, overrides: dict[str, Any], where: str) -> None:
    """``overrides`` are fields of ``name``'s config that its ``validate`` accepts."""
    config_cls = registry()[name][1]
    fields = [f.name for f in dataclasses.fields(config_cls)]
    for key in overrides:
        if key in RUN_OWNED:
            raise ConfigError(f"{where}: {key!r} is set by --{key}, not by a dataset's config")
        if key not in fields:
            near = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(
                f"{where}: {name} has no config key {key!r}{hint} (its keys: {', '.join(fields)})"
            )
    try:
        config = config_cls(**overrides)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as exc:  # the dataset's own checks: assertions, ValueErrors
        raise ConfigError(f"{where}: {name} refuses config {overrides}: {exc!r}") from None


def counts(choices: list[DatasetChoice], size: int) -> list[int]:
    """``size`` split in proportion to the weights, by largest remainders (ties: order)."""
    total = sum(c.weight for c in choices)
    exact = [size * c.weight / total for c in choices]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(choices)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: size - sum(out)]:
        out[i] += 1
    return out


def make_rows(
    choices: list[DatasetChoice],
    size: int,
    seed: int,
    *,
    prompt: str | None = PROMPT,
    scripted: bool = False,
    agent: str | None = None,
) -> Iterator[dict[str, Any]]:
    """``size`` rows of ``choices``; ``scripted`` adds a scripted-model script (the reference
    answer and a wrong one) and ``rollgym_check`` answers, for demos and tests; ``agent`` sets
    each row's ``agent_ref`` (a run of several agents routes rows by it)."""
    made = version()
    picks: list[tuple[int, int]] = []
    datasets = []
    for d, (choice, n) in enumerate(zip(choices, counts(choices, size), strict=True)):
        datasets.append(_entries(choice, n, seed))
        picks += [(d, i) for i in range(n)]
    random.Random(seed).shuffle(picks)
    for d, i in picks:
        choice = choices[d]
        i, entry = datasets[d][i]
        try:
            plain, patches = carry(entry)
        except NotCarried as exc:
            raise ConfigError(
                f"{choice.name} entry {i} cannot be carried in a row: {exc}"
            ) from None
        row = row_of(choice, plain, patches, made, prompt=prompt, scripted=scripted)
        yield {"agent_ref": {"name": agent}, **row} if agent else row


def _entries(choice: DatasetChoice, n: int, seed: int) -> list[tuple[int, dict[str, Any]]]:
    """``n`` entries of ``choice`` made with ``seed``, with their indices, leaving out those
    whose own reference answer the screen refuses (``guard.screen``): no answer could earn
    their reward. 0.1.25's intermediate_integration gives one in ten a reference that is an
    unevaluated ``Integral(...)``. If any is left out, a larger dataset is made instead."""
    import reasoning_gym

    made = n
    for attempt in range(3):
        dataset = reasoning_gym.create_dataset(choice.name, **choice.config, size=made, seed=seed)
        kept = [(i, e) for i in range(made) if _solvable(choice.name, e := dataset[i])]
        if len(kept) >= n:
            return kept[:n]
        if attempt < 2:
            made = 2 * made + 8
    raise ConfigError(
        f"{choice.name}: of {made} entries only {len(kept)} have a reference answer the "
        "environment accepts (guard.screen refuses the rest)"
    )


def _solvable(name: str, entry: dict[str, Any]) -> bool:
    reference = entry.get("answer")
    return not isinstance(reference, str) or guard.screen(name, reference, entry) is None


def row_of(
    choice: DatasetChoice,
    plain: dict[str, Any],
    patches: list[Any],
    made: str,
    *,
    prompt: str | None,
    scripted: bool,
) -> dict[str, Any]:
    messages = [{"role": "system", "content": prompt}] if prompt else []
    messages.append({"role": "user", "content": plain["question"]})
    params: dict[str, Any] = {"input": messages}
    carried: dict[str, Any] = {"dataset": choice.name, "config": choice.config, "version": made}
    if patches:
        carried["restore"] = patches
    row: dict[str, Any] = {"responses_create_params": params, **plain, ROW_FIELD: carried}
    reference = plain.get("answer")
    if scripted and isinstance(reference, str):
        good = f"<answer>{reference}</answer>"
        say = [f"Thinking it through. {good}", f"Thinking it through. {WRONG_ANSWER}"]
        params["metadata"] = {"rollgym_script": json.dumps([{"say": say}])}
        row["rollgym_check"] = {"reference": good, "wrong": WRONG_ANSWER}
    return row


HASH_SEED = "0"


def write_rows(
    output: Path,
    choices: list[DatasetChoice],
    size: int,
    seed: int,
    *,
    prompt: str | None = PROMPT,
    scripted: bool = False,
    agent: str | None = None,
) -> int:
    """Write ``make_rows`` to ``output`` (whole or not at all) from a process whose string
    hashes are seeded by ``HASH_SEED``; the number of rows."""
    args = (output, choices, size, seed, prompt, scripted, agent)
    if os.environ.get("PYTHONHASHSEED") == HASH_SEED:
        return _write(*args)
    before = os.environ.get("PYTHONHASHSEED")
    # A spawned child starts a new interpreter with this process's environment.
    os.environ["PYTHONHASHSEED"] = HASH_SEED
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            written: int = pool.submit(_write, *args).result()
    finally:
        if before is None:
            del os.environ["PYTHONHASHSEED"]
        else:
            os.environ["PYTHONHASHSEED"] = before
    return written


def _write(
    output: Path,
    choices: list[DatasetChoice],
    size: int,
    seed: int,
    prompt: str | None,
    scripted: bool,
    agent: str | None,
) -> int:
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    count = 0
    with partial.open("w", encoding="utf-8") as fh:
        for row in make_rows(choices, size, seed, prompt=prompt, scripted=scripted, agent=agent):
            fh.write(dump_row(row) + "\n")
            count += 1
    os.replace(partial, output)  # a reader never sees half a file
    return count


def dump_row(row: dict[str, Any]) -> str:
    """One JSONL line: the same row always gives the same bytes."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
