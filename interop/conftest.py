"""Fixtures of the interop suite.

NeMo Gym 0.4.0 (``stacks``): one NeMo Gym stack and one rollgym stack for the whole session
(each costs ~30 s to start on 2 cores, so every 0.4 test shares them); it fails, naming
``interop/setup.sh``, when ``.interop-venv`` is missing.

rollgym (``rollgym serve``): the scripted model and the parity environments (mcqa with three
grading modes, math). NeMo Gym (``gym env start``, offline, its own local Ray): its
``openai_model`` in front of rollgym's scripted model as ``policy_model``; its
``example_single_tool_call`` and ``example_session_state_mgmt`` servers, each with its
``simple_agent``; its ``mcqa`` (three grading modes) and ``math_with_judge`` (judge off);
rollgym's ``lookup`` environment launched by NeMo Gym with a ``simple_agent`` in front of it;
and rollgym's ``tool_agent`` launched by NeMo Gym (``rollgym_agent``) for its collector.

NeMo Gym 0.7.0 (for ``test_ng07_*.py``): each of these skips its test when ``.interop07-venv``
is missing (``interop/setup.sh --nemo 0.7`` builds it).

- ``ng07``: the release (``nemo.NG07``: its venv, ``site_packages()``, ``gym``).
- ``scripted_model``: rollgym's scripted model (``rollgym serve``), its URL; one per session.
- ``ng07_stack``: ``ng07_stack(config, name="...")`` starts a 0.7 stack from a config dict and
  answers the running ``nemo.GymStack`` (``.urls`` by instance name, ``.head_port``, ``.config``
  with the relays added, ``.workspace``). Build the config with ``nemo``'s builders, ports from
  ``nemo.free_port()``:
  - ``policy_model`` (0.7's ``openai_model`` in front of the scripted model) is added when the
    config has none;
  - rollgym's servers in it start through the shims: ``nemo.rollgym_agent(port, resources)`` as
    an agent server, ``nemo.rollgym_agent(..., kind=nemo.ENVIRONMENTS)`` as an Environment
    Server (0.7's collector posts to its ``/run``), ``nemo.rollgym_env(port, impl)`` as a
    resources server;
  - every agent no Environment Server fronts gets the ``legacy_agent`` relay 0.7 would generate
    (same name, e.g. ``mcqa_environment_server`` for ``mcqa_simple_agent``), on a port of ours;
    ``relays=False`` leaves that to 0.7 (the URLs still come back, from the head server);
  - the workspace also holds ``nemo.LOCAL_SERVERS07`` (``interop_mask``: ``nemo.mask_env``).
  A name starts once per session (test files share a stack by name and the same config); every
  stack stops at the end of the session, by its process session (0.7 leaves its servers
  running after its own shutdown). Run 0.7's collector against it with
  ``interop.gym_eval.eval_run(stack, rows, out, *overrides)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from interop import nemo
from interop.nemo import free_port, openai_model, server_entry, simple_agent
from interop.rollgym_side import rollgym_serve, write_config

MCQA_MODES = {"": None, "md": "lenient_answer_colon_md", "lb": "lenient_boxed"}


@dataclass
class Stacks:
    rollgym: dict[str, str]  # rollgym server name -> URL
    nemo: dict[str, str]  # NeMo Gym instance name -> URL
    head_port: int
    workspace: nemo.Workspace


def rollgym_config() -> dict[str, object]:
    servers: dict[str, object] = {"model": {"kind": "model", "impl": "scripted"}}
    for suffix, mode in MCQA_MODES.items():
        options = {"grading_mode": mode} if mode else {}
        servers[f"mcqa{suffix}"] = {"kind": "resources", "impl": "mcqa", "options": options}
    servers["math"] = {"kind": "resources", "impl": "math"}
    return {"servers": servers}


def nemo_config(model_url: str) -> dict[str, object]:
    port = free_port
    config: dict[str, object] = {"policy_model": openai_model(port(), model_url + "/v1")}
    for env in ("example_single_tool_call", "example_session_state_mgmt"):
        config[env] = server_entry("resources_servers", env, port(), domain="agent")
        config[f"{env}_simple_agent"] = simple_agent(port(), env)
    for suffix, mode in MCQA_MODES.items():
        config[f"mcqa{suffix}"] = server_entry(
            "resources_servers", "mcqa", port(), grading_mode=mode, domain="knowledge"
        )
    config["math_with_judge"] = server_entry(
        "resources_servers",
        "math_with_judge",
        port(),
        should_use_judge=False,
        judge_model_server=nemo.ref("responses_api_models", "policy_model"),
        judge_responses_create_params={"input": []},
        domain="math",
    )
    config["rollgym_lookup"] = nemo.rollgym_env(port(), "lookup")
    config["rollgym_lookup_simple_agent"] = simple_agent(port(), "rollgym_lookup")
    config["rollgym_agent"] = nemo.rollgym_agent(port(), "example_single_tool_call")
    return config


@pytest.fixture(scope="session")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stacks]:
    nemo.NG04.site_packages()  # fails at once, naming setup.sh, when the interop venv is missing
    root = tmp_path_factory.mktemp("interop")
    with rollgym_serve(write_config(root / "rollgym.yaml", rollgym_config())) as urls:
        rollgym = {name: found[0] for name, found in urls.items()}
        workspace = nemo.Workspace(root / "nemo")
        stack = nemo.GymStack(workspace, nemo_config(rollgym["model"]))
        started = stack.start(timeout=240)
        try:
            yield Stacks(rollgym, started, stack.head_port, workspace)
        finally:
            stack.stop()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path


# -- NeMo Gym 0.7.0 ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ng07() -> nemo.NemoGym:
    if not nemo.NG07.installed():
        pytest.skip(f"no NeMo Gym 0.7 venv at {nemo.NG07.venv} (run {nemo.NG07.setup})")
    return nemo.NG07


@pytest.fixture(scope="session")
def scripted_model(ng07: nemo.NemoGym, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("scripted-model")
    config = {"servers": {"model": {"kind": "model", "impl": "scripted"}}}
    with rollgym_serve(write_config(root / "model.yaml", config)) as urls:
        yield urls["model"][0]


@dataclass
class Ng07Stacks:
    """``ng07_stack``: 0.7 stacks started by name, each once per session."""

    gym: nemo.NemoGym
    model_url: str
    root: Path
    started: dict[str, tuple[dict[str, Any], nemo.GymStack]] = field(default_factory=dict)

    def __call__(
        self,
        config: dict[str, Any],
        *,
        name: str = "stack",
        timeout: float = 420.0,
        relays: bool = True,
        overrides: tuple[str, ...] = (),
    ) -> nemo.GymStack:
        if name in self.started:
            given, stack = self.started[name]
            if given != config:
                raise ValueError(f"0.7 stack {name!r} was started with another config")
            return stack
        full = dict(config)
        if "policy_model" not in full:
            full = {**nemo.policy_model(self.model_url), **full}
        workspace = nemo.Workspace(self.root / name, self.gym, local=nemo.LOCAL_SERVERS07)
        stack = nemo.GymStack(workspace, full, relays=relays, overrides=overrides)
        stack.start(timeout=timeout)
        self.started[name] = (config, stack)
        return stack

    def stop(self) -> None:
        for _, stack in self.started.values():
            stack.stop()
        self.started.clear()


@pytest.fixture(scope="session")
def ng07_stack(
    ng07: nemo.NemoGym, scripted_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ng07Stacks]:
    stacks = Ng07Stacks(ng07, scripted_model, tmp_path_factory.mktemp("ng07"))
    try:
        yield stacks
    finally:
        stacks.stop()
