"""NeMo RL's calling pattern run twice, the same way: against NeMo Gym 0.7 and against rollgym.

``tests/support/nemo_rl.py`` is NeMo RL's sequence (``_spinup``, ``run_rollouts``, the
post-processing checks), written with the standard library and the four ``nemo_gym`` names
only, so it runs as a script in either venv:

- NeMo Gym 0.7: ``.interop07-venv``'s Python, its own ``nemo_gym`` (``RunHelper`` launches
  0.7's servers from the config, and a local Ray of its own), in a ``Workspace`` whose venv links
  let it start offline;
- rollgym: rollgym's venv with ``rollgym.integrations.nemo_rl.shim_path()`` first on ``PYTHONPATH``.

Each side runs in a process session of its own; what is left of that session after the script
has shut its helper down is killed and reported (0.7 leaves its servers running).

The model is rollgym's scripted model (0.7's ``openai_model`` in front of it; rollgym's agent
calls it directly), answering a row whose input says ``FAIL`` with a 500 (``failing``), or for
the token fields a vLLM-shaped double (``tests.models.vllm_double``: 0.7's ``vllm_model`` with
NeMo RL's ``return_token_id_information: true`` against rollgym's ``openai_proxy`` with
``return_token_ids``, both on NeMo RL's list of URLs).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from interop import nemo
from interop.nemo import AGENTS, ENVIRONMENTS, MODELS, RESOURCES, NemoGym, Workspace, ref
from interop.rollouts import scripted

NEMO_RL = nemo.ROOT / "tests" / "support" / "nemo_rl.py"
FAIL = "FAIL-ME-PLEASE"
MCQA_AGENT = "mcqa_simple_agent"
SIDE_TIMEOUT = 600.0


# -- rows --------------------------------------------------------------------------------------


def mcqa_rows(gym: NemoGym, *, failing: bool = True) -> list[dict[str, Any]]:
    """0.7's mcqa example rows, each answered right and wrong by the scripted model, with
    ``agent_ref`` (NeMo RL requires one); ``failing``: one more row whose model call fails."""
    path = gym.site_packages() / RESOURCES / "mcqa" / "data" / "example.jsonl"
    rows = []
    for line in path.read_text().splitlines():
        base = json.loads(line)
        right = base["expected_answer"]
        wrong = "A" if right != "A" else "B"
        for letter in (right, wrong):
            row = scripted(base, [{"say": f"Thinking done. \\boxed{{{letter}}}"}])
            rows.append({**row, "agent_ref": {"name": MCQA_AGENT}})
    if failing:
        row = copy.deepcopy(rows[0])
        row["responses_create_params"]["input"][0]["content"] += f" {FAIL}"
        rows.append(row)
    return rows


# -- configs -----------------------------------------------------------------------------------


def _instance(kind: str, impl: str, **fields: Any) -> dict[str, Any]:
    """A 0.7 server instance with no host or port: 0.7 gives it NeMo RL's ``default_host`` and
    a port of NeMo RL's range, as it does for NeMo RL."""
    return {kind: {impl: {"entrypoint": "app.py", **fields}}}


def ng07_config(workspace: Workspace, *, model: str) -> dict[str, Any]:
    """NeMo RL's ``env.nemo_gym`` for 0.7: ``policy_model`` (``openai_model`` in front of the
    scripted model, or ``model="vllm"``: ``vllm_model`` as NeMo RL's
    ``vllm_model_for_training.yaml`` sets it up), 0.7's mcqa with its ``simple_agent`` and the
    ``legacy_agent`` relay its own config declares; offline venvs and logs in ``workspace``."""
    if model == "vllm":
        policy = _instance(
            MODELS, "vllm_model", base_url="${policy_base_url}", api_key="${policy_api_key}",
            model="${policy_model_name}", return_token_id_information=True,
            request_prompt_and_generation_token_ids=False, uses_reasoning_parser=True,
        )  # fmt: skip
    else:
        # openai_model takes one URL: the first of NeMo RL's list.
        policy = _instance(
            MODELS, "openai_model", openai_base_url="${policy_base_url[0]}",
            openai_api_key="${policy_api_key}", openai_model="${policy_model_name}",
            openai_default_headers={},
        )  # fmt: skip
    config: dict[str, Any] = {
        "policy_model": policy,
        "mcqa": _instance(
            RESOURCES,
            "mcqa",
            grading_mode=None,
            domain="knowledge",
            verified=False,
            description="mcqa",
        ),
        MCQA_AGENT: _instance(
            AGENTS,
            "simple_agent",
            resources_server=ref(RESOURCES, "mcqa"),
            model_server=ref(MODELS, "policy_model"),
        ),
        "mcqa_environment_server": _instance(
            ENVIRONMENTS, "legacy_agent", agent_server=ref(AGENTS, MCQA_AGENT)
        ),
        # NeMo RL's examples pass these through env.nemo_gym for prebuilt venvs.
        "skip_venv_if_present": True,
        "uv_venv_dir": str(workspace.venvs),
        "nemo_gym_log_dir": str(workspace.path / "logs"),
    }
    for _, kind, impl, _ in nemo.servers(config):
        workspace.link_venv(kind, impl)
    return config


def rollgym_config(*, model_url: str | None = None) -> dict[str, Any]:
    """The same stack in rollgym: its mcqa and its agent (NeMo Gym's agent name mapped to it)
    and as the policy model ``openai_proxy`` with ``return_token_ids`` on NeMo RL's URLs, or
    ``model_url`` as it is (the scripted model reads its script from the Responses API's
    ``metadata``, which a chat completions upstream never sees)."""
    if model_url is not None:
        policy: dict[str, Any] = {"kind": "model", "url": model_url}
    else:
        options = {"base_url": "${policy_base_url}", "model": "${policy_model_name}",
                   "return_token_ids": True}  # fmt: skip
        policy = {"kind": "model", "impl": "openai_proxy", "options": options}
    return {
        "rollgym_config": {
            "servers": {
                "policy_model": policy,
                "mcqa": {"kind": "resources", "impl": "mcqa"},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "policy_model", "resources": "mcqa"},
                },
            },
            "collect": {"agent_aliases": {MCQA_AGENT: "agent"}},
        }
    }


# -- running one side --------------------------------------------------------------------------


@dataclass
class SideRun:
    """What NeMo RL's sequence saw on one side, and what it left running."""

    results: dict[int, Any]  # _rowidx -> result (or {"raised": ...})
    post: dict[int, Any]  # _rowidx -> what NeMo RL's post-processing read, or its error
    poll: str
    leftovers: list[str]  # command lines of the side's processes alive after its shutdown
    log: str


def run_side(
    python: Path,
    cfg: dict[str, Any],
    rows: list[dict[str, Any]],
    workdir: Path,
    *,
    env: dict[str, str],
    timeout: float = SIDE_TIMEOUT,
) -> SideRun:
    """``tests/support/nemo_rl.py`` with ``python`` in ``workdir``, in a session of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec, out, log = workdir / "spec.json", workdir / "out.json", workdir / "nemo_rl.log"
    dotenv = workdir / "nemo_gym_env.yaml"  # NeMo RL's <repo>/nemo_gym_env.yaml: absent
    spec.write_text(json.dumps({"cfg": cfg, "rows": rows, "dotenv": str(dotenv)}))
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    full_env.pop("VIRTUAL_ENV", None)
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(python), str(NEMO_RL), str(spec), str(out)],
            cwd=workdir, env=full_env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        code = proc.wait(timeout=timeout)
    finally:
        leftovers = _end_session(proc)
    text = log.read_text(errors="replace")
    if code != 0 or not out.exists():
        raise RuntimeError(f"NeMo RL's sequence failed (exit {code}):\n{text[-6000:]}")
    data = json.loads(out.read_text())
    return SideRun(
        results={int(i): r for i, r in data["results"]},
        post={int(i): p for i, p in data["post"].items()},
        poll=data["poll"],
        leftovers=leftovers,
        log=text,
    )


def ng07_env(ray_tmp: str) -> dict[str, str]:
    return {
        "RAY_ADDRESS": "local",  # a new local Ray, never someone else's cluster
        "RAY_TMPDIR": ray_tmp,  # short: Ray's unix socket paths stop at 107 bytes
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }


def rollgym_env() -> dict[str, str]:
    from rollgym.integrations.nemo_rl import shim_path

    return {"PYTHONPATH": os.pathsep.join([str(shim_path()), str(nemo.ROOT / "src")])}


def short_tmp() -> str:
    return tempfile.mkdtemp(prefix="rgr-", dir="/tmp")


def _end_session(proc: subprocess.Popen[bytes]) -> list[str]:
    """Kill the script if it still runs, and every process left in its session; return the
    command lines of those that outlived it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    left = _session(proc.pid)
    lines = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(p.cmdline())[:200])
    nemo.kill_pids(left)
    return lines


def _session(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


# -- the model ---------------------------------------------------------------------------------


def failing(app: Callable[..., Awaitable[None]], marker: str) -> Callable[..., Awaitable[None]]:
    """``app``, answering 500 (as a dying engine) to every POST whose body holds ``marker``,
    on every API (0.7's ``openai_model`` calls ``/v1/responses``, rollgym's proxy
    ``/v1/chat/completions``), but ``/tokenize``."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].endswith("/tokenize"):
            await app(scope, receive, send)
            return
        messages, body, more = [], b"", True
        while more:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if marker.encode() in body:
            error = json.dumps({"error": {"message": "engine died", "code": 500}}).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": error})
            return
        replay = iter(messages)

        async def again() -> Any:
            return next(replay, None) or await receive()

        await app(scope, again, send)

    return wrapped


def scripted_app() -> Any:
    """rollgym's scripted model as an ASGI app."""
    from rollgym.config import ServerConfig
    from rollgym.models.scripted import ScriptedModel
    from rollgym.server.app import build_app
    from rollgym.server.base import ServerContext

    cfg = ServerConfig.model_validate({"kind": "model", "impl": "scripted"})
    return build_app(ScriptedModel(ServerContext(name="model", config=cfg, peers={})))


def output_text(result: dict[str, Any]) -> str:
    """The assistant's text of a result (what mcqa grades)."""
    texts = []
    for item in result.get("response", {}).get("output", []):
        if item.get("type") == "message" and item.get("role") == "assistant":
            texts += [c.get("text", "") for c in item.get("content", []) if isinstance(c, dict)]
    return "".join(texts)


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


ROLLGYM_PYTHON = Path(sys.executable)
