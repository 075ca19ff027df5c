"""One NeMo Gym stack and one rollgym stack for the whole interop session (each costs ~30 s to
start on 2 cores, so every test shares them).

rollgym (``rollgym serve``): the scripted model and the parity environments (mcqa with three
grading modes, math). NeMo Gym (``gym env start``, offline, its own local Ray): its
``openai_model`` in front of rollgym's scripted model as ``policy_model``; its
``example_single_tool_call`` and ``example_session_state_mgmt`` servers, each with its
``simple_agent``; its ``mcqa`` (three grading modes) and ``math_with_judge`` (judge off);
rollgym's ``lookup`` environment launched by NeMo Gym with a ``simple_agent`` in front of it;
and rollgym's ``tool_agent`` launched by NeMo Gym (``rollgym_agent``) for its collector.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    nemo.site_packages()  # fails at once, naming setup.sh, when the interop venv is missing
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
