"""Run the real NeMo Gym (0.4.0 in a Python 3.12 venv, 0.7.0 in a Python 3.13 one) next to
rollgym, on 127.0.0.1.

- ``NemoGym``: one installed release (``NG04``, ``NG07``): its version and its venv.
- ``Workspace``: the directory ``gym env start`` runs in. NeMo Gym would build one uv venv per
  server (network); ``+skip_venv_if_present=true +uv_venv_dir=DIR`` makes it use
  ``DIR/<type>/<name>/.venv`` instead, so each server gets a link to a venv we already have:
  NeMo Gym's own servers the release's venv, rollgym's shims rollgym's venv.
- ``GymStack``: ``gym env start`` for a generated config; stopped by session. It starts a local
  Ray (``RAY_ADDRESS=local``, so it never joins a cluster someone else runs on this machine).
  On 0.7 every agent no environment server fronts gets an explicit ``legacy_agent`` relay (the
  one 0.7 would generate, on a port we chose), so no server listens where nobody knows.
- ``server_entry`` and the builders below it: server instances of NeMo Gym's config, on ports we
  chose (so tests know where each listens without asking the head server).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLLGYM_VENV = ROOT / ".venv"
SHIM_DIR = Path(__file__).with_name("shim")

MODELS = "responses_api_models"
RESOURCES = "resources_servers"
AGENTS = "responses_api_agents"
ENVIRONMENTS = "environment_servers"  # 0.7's new server kind
SERVER_KINDS = (MODELS, RESOURCES, AGENTS, ENVIRONMENTS)

# rollgym servers that ``gym env start`` launches as its own (server type -> shim name). On 0.7
# rollgym's agent may also stand as an Environment Server (episode ``/run``).
SHIMS = {AGENTS: "rollgym_agent", RESOURCES: "rollgym_env", ENVIRONMENTS: "rollgym_agent"}


@dataclass(frozen=True)
class NemoGym:
    """One installed NeMo Gym release: its version and the venv that runs it."""

    version: str
    venv: Path
    setup: str  # the command that builds the venv

    @property
    def gym(self) -> str:
        return str(self.venv / "bin" / "gym")

    @property
    def environment_servers(self) -> bool:
        """Whether this release has Environment Servers (0.7: the collector posts only to them)."""
        return tuple(int(x) for x in self.version.split(".")[:2]) >= (0, 7)

    def installed(self) -> bool:
        return any(p.is_dir() for p in self.venv.glob("lib/python3.*/site-packages/nemo_gym"))

    def site_packages(self) -> Path:
        """Where its servers are installed (NeMo Gym's ``PARENT_DIR`` in a wheel install)."""
        found = sorted(self.venv.glob("lib/python3.*/site-packages"))
        if not found or not (found[0] / "nemo_gym").is_dir():
            raise RuntimeError(f"no NeMo Gym {self.version} in {self.venv}: run {self.setup} first")
        return found[0]


NG04 = NemoGym(
    "0.4.0", Path(os.environ.get("INTEROP_VENV", ROOT / ".interop-venv")), "interop/setup.sh"
)
NG07 = NemoGym(
    "0.7.0",
    Path(os.environ.get("INTEROP07_VENV", ROOT / ".interop07-venv")),
    "interop/setup.sh --nemo 0.7",
)
RELEASES = {"0.4": NG04, "0.7": NG07}
INTEROP_VENV = NG04.venv


def site_packages(venv: Path = INTEROP_VENV) -> Path:
    """Where NeMo Gym's servers are installed in ``venv`` (0.4's by default)."""
    gym = next((g for g in RELEASES.values() if g.venv == venv), None)
    return (gym or NemoGym("?", venv, "interop/setup.sh")).site_packages()


def free_port() -> int:
    # Bound and released at once; a small race, which NeMo Gym's own allocator also has.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: Any = None, *, timeout: float = 60.0) -> tuple[int, Any]:
    """POST ``body`` (GET without one); answer (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_listening(port: int, *, timeout: float, alive: Any = None) -> None:
    """Wait until something accepts connections on 127.0.0.1:port (``alive()`` false: give up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the process serving port {port} exited")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


# -- configs -------------------------------------------------------------------------------


def nemo_configs(resources_server: str, gym: NemoGym = NG04) -> dict[str, Any]:
    """NeMo Gym's own config files of one resources server, merged (instance name -> entry)."""
    merged: dict[str, Any] = {}
    folder = gym.site_packages() / RESOURCES / resources_server
    for path in sorted(folder.glob("configs/*.yaml")):
        merged.update(yaml.safe_load(path.read_text()) or {})
    return merged


def server_entry(kind: str, name: str, port: int, **fields: Any) -> dict[str, Any]:
    """One NeMo Gym server instance ``{kind: {name: {...}}}`` on 127.0.0.1:port."""
    return {kind: {name: {"entrypoint": "app.py", "host": "127.0.0.1", "port": port, **fields}}}


def ref(kind: str, name: str) -> dict[str, str]:
    return {"type": kind, "name": name}


def openai_model(port: int, base_url: str) -> dict[str, Any]:
    """NeMo Gym's ``openai_model`` in front of an OpenAI-compatible server (rollgym's scripted)."""
    return server_entry(
        MODELS,
        "openai_model",
        port,
        openai_base_url=base_url,
        openai_api_key="interop-unused",  # the scripted model reads no key
        openai_model="rollgym-scripted",
        openai_default_headers={},
    )


def policy_model(model_url: str, port: int | None = None) -> dict[str, Any]:
    """``policy_model`` (``openai_model`` in front of ``model_url``, rollgym's scripted model)
    and the top-level ``policy_*`` values NeMo Gym's own configs interpolate."""
    return {
        "policy_base_url": model_url + "/v1",
        "policy_api_key": "interop-unused",
        "policy_model_name": "rollgym-scripted",
        "policy_model": openai_model(port or free_port(), model_url + "/v1"),
    }


def simple_agent(port: int, resources: str, model: str = "policy_model") -> dict[str, Any]:
    return server_entry(
        AGENTS,
        "simple_agent",
        port,
        resources_server=ref(RESOURCES, resources),
        model_server=ref(MODELS, model),
    )


def rollgym_agent(
    port: int,
    resources: str,
    impl: str = "tool_agent",
    *,
    kind: str = AGENTS,
    model: str = "policy_model",
    **options: Any,
) -> dict[str, Any]:
    """rollgym's agent as a NeMo Gym server (started by ``gym env start`` via the shim): an
    agent server (``kind=AGENTS``), or on 0.7 an Environment Server (``kind=ENVIRONMENTS``:
    0.7's collector posts its episodes, or flat rows routed to it, to its ``/run``)."""
    extra = {"options": options} if options else {}
    return server_entry(
        kind,
        SHIMS[kind],
        port,
        impl=impl,
        resources_server=ref(RESOURCES, resources),
        model_server=ref(MODELS, model),
        **extra,
    )


def rollgym_env(port: int, impl: str, **options: Any) -> dict[str, Any]:
    """A rollgym environment as a NeMo Gym resources server (``gym env start`` via the shim)."""
    return server_entry(
        RESOURCES, SHIMS[RESOURCES], port, impl=impl, options=options, domain="other"
    )


def legacy_agent(port: int, agent: str) -> dict[str, Any]:
    """0.7's ``legacy_agent`` Environment Server: relays ``/run`` to ``agent`` unchanged."""
    return server_entry(ENVIRONMENTS, "legacy_agent", port, agent_server=ref(AGENTS, agent))


def single_agent_turn(
    port: int,
    resources: str,
    agent: str,
    *,
    episode_timeout: float = 600.0,
    cleanup_timeout: float = 30.0,
    transports: tuple[str, ...] = ("direct_http",),
) -> dict[str, Any]:
    """0.7's ``single_agent_turn`` Environment Server: one episode = seed the resources and
    the agent's session, one agent turn, close, verify (sheet §1.4). ``transports``: how the
    agent is granted the resources server's tools (without a grant a tool call fails)."""
    return server_entry(
        ENVIRONMENTS,
        "single_agent_turn",
        port,
        resources_server=ref(RESOURCES, resources),
        agent_server=ref(AGENTS, agent),
        resources_tool_transports=list(transports),
        max_concurrent_episodes=None,
        queue_timeout_seconds=None,
        default_episode_timeout_seconds=episode_timeout,
        cleanup_timeout_seconds=cleanup_timeout,
    )


def servers(config: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(instance name, server kind, implementation, fields) of every server instance of a config
    (other top-level values, e.g. ``policy_base_url`` or ``environment_server_routes``, skipped)."""
    for name, entry in config.items():
        if not (isinstance(entry, dict) and len(entry) == 1):
            continue
        kind, inner = next(iter(entry.items()))
        if kind in SERVER_KINDS and isinstance(inner, dict) and len(inner) == 1:
            impl, fields = next(iter(inner.items()))
            if isinstance(fields, dict):
                yield name, kind, impl, fields


def instance_urls(config: dict[str, Any]) -> dict[str, str]:
    """Instance name -> URL of every server instance of a NeMo Gym config that has a port."""
    return {
        name: f"http://{fields['host']}:{fields['port']}"
        for name, _, _, fields in servers(config)
        if fields.get("host") and fields.get("port")
    }


def relay_name(agent: str, agent_type: str) -> str:
    """The name 0.7 gives the relay it generates for an agent (``mcqa_simple_agent`` ->
    ``mcqa_environment_server``): the agent type, else a trailing ``_agent``, dropped."""
    stem = agent.removesuffix(f"_{agent_type}").removesuffix(agent_type).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    return f"{stem or agent_type}_environment_server"


def fronted_agents(config: dict[str, Any]) -> set[str]:
    """Agents some Environment Server of the config names (``agent_server``, or any field
    referencing an agent), as 0.7 counts them."""
    found = set()
    for _, kind, _, fields in servers(config):
        if kind != ENVIRONMENTS:
            continue
        for key, value in fields.items():
            if isinstance(value, dict) and (
                value.get("type") == AGENTS or (key == "agent_server" and "type" not in value)
            ):
                found.add(str(value.get("name")))
    return found


def with_relays(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` plus, for every agent no Environment Server fronts, the ``legacy_agent``
    relay 0.7 would generate for it (same name), on a port of ours: 0.7 would put it on a port
    nobody here knows, and warn that the config is deprecated."""
    fronted = fronted_agents(config)
    out = dict(config)
    for name, kind, impl, _ in list(servers(config)):
        if kind != AGENTS or name in fronted:
            continue
        relay = relay_name(name, impl)
        if relay in out:  # as 0.7 names it on a clash: after the whole agent name
            relay = f"{name}_environment_server"
        while relay in out:
            relay = f"{relay}_environment_server"
        out[relay] = legacy_agent(free_port(), name)
    return out


# NeMo Gym servers of our own that a workspace can hold (``Workspace(local=...)``).
LOCAL_SERVERS07 = {
    (RESOURCES, "interop_mask"): Path(__file__).with_name("servers07") / "interop_mask"
}


def mask_env(port: int) -> dict[str, Any]:
    """``interop_mask`` (``interop/servers07``): a 0.7 resources server paying 1 when the answer
    holds the row's ``expected`` and masking the rows that say ``mask: true``."""
    return server_entry(RESOURCES, "interop_mask", port, domain="other")


# -- the workspace and the stack -----------------------------------------------------------


@dataclass
class Workspace:
    """A directory for ``gym env start``: its cwd, config, venv links, logs and Ray temp dir.

    ``local``: more server directories (``{(kind, name): source dir}``) to copy into the cwd,
    where ``gym env start`` looks first; they run in the release's venv (NeMo Gym servers of
    our own, e.g. a tiny resources server for one behaviour)."""

    path: Path
    gym: NemoGym = NG04
    local: dict[tuple[str, str], Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        copies = {(kind, name): SHIM_DIR / name for kind, name in SHIMS.items()} | self.local
        for (kind, name), source in copies.items():
            target = self.path / kind / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(source, target)

    @property
    def venvs(self) -> Path:
        return self.path / "venvs"

    def link_venv(self, kind: str, name: str) -> None:
        """``uv_venv_dir/<kind>/<name>/.venv``: rollgym's venv for a shim, else the release's."""
        target = ROLLGYM_VENV if SHIMS.get(kind) == name else self.gym.venv
        link = self.venvs / kind / name / ".venv"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target.resolve(), target_is_directory=True)


@dataclass
class GymStack:
    """``gym env start`` for ``config``; ``start()`` waits for every server, ``stop()`` ends
    every process of the session it started.

    On 0.7, ``relays=True`` (the default) adds the explicit relays of ``with_relays`` (so
    ``config`` after ``start`` holds them); ``relays=False`` leaves them to 0.7, and ``start``
    learns their ports from the head server. ``overrides``: more Hydra arguments."""

    workspace: Workspace
    config: dict[str, Any]
    head_port: int = field(default_factory=free_port)
    relays: bool = True
    overrides: tuple[str, ...] = ()
    urls: dict[str, str] = field(default_factory=dict)  # instance name -> URL, once started
    exit_code: int | None = None  # gym env start's, once stopped (0 after a clean SIGINT)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    ray_tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rgi-", dir="/tmp"))

    @property
    def gym(self) -> NemoGym:
        return self.workspace.gym

    @property
    def head(self) -> str:
        return f"http://127.0.0.1:{self.head_port}"

    def args(self) -> list[str]:
        config_file = self.workspace.path / "interop_config.yaml"
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [
            self.gym.gym,
            "env",
            "start",
            f"+config_paths=[{config_file}]",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={self.workspace.venvs}",
            f"+head_server={{host: 127.0.0.1, port: {self.head_port}}}",
            f"+nemo_gym_log_dir={self.workspace.path / 'logs'}",
            *self.overrides,
        ]

    def start(self, timeout: float = 180.0) -> dict[str, str]:
        if self.gym.environment_servers and self.relays:
            self.config = with_relays(self.config)
        for _, kind, impl, _ in servers(self.config):
            self.workspace.link_venv(kind, impl)
        if self.gym.environment_servers:  # the relays 0.7 generates itself (relays=False)
            self.workspace.link_venv(ENVIRONMENTS, "legacy_agent")
        self.log = self.workspace.path / "gym-env-start.log"
        env = {
            **os.environ,
            "RAY_ADDRESS": "local",  # a new local Ray, never someone else's cluster
            # Ray's unix sockets live under its temp dir: AF_UNIX paths stop at 107 bytes.
            "RAY_TMPDIR": self.ray_tmp,
            "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("VIRTUAL_ENV", None)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.args(),
                cwd=self.workspace.path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: every process it starts, found by sid
            )
        urls = instance_urls(self.config)

        def alive() -> bool:
            return self.proc is not None and self.proc.poll() is None

        try:
            wait_listening(self.head_port, timeout=timeout, alive=alive)
            if self.gym.environment_servers:
                urls = {**self.served_urls(), **urls}
            for url in urls.values():
                port = int(url.rsplit(":", 1)[1])
                wait_listening(port, timeout=timeout, alive=alive)
            if self.gym.environment_servers:
                self.wait_ready(timeout, alive)
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log.read_text(errors="replace")[-4000:]
            self.stop()
            raise RuntimeError(f"gym env start failed: {exc}\n--- log tail ---\n{tail}") from exc
        except BaseException:  # Ctrl-C while waiting: leave nothing running
            self.stop()
            raise
        self.urls = urls
        return urls

    def served_urls(self) -> dict[str, str]:
        """Every instance of the config the head server serves (0.7: relays it generated too)."""
        status, body = http_json(self.head + "/global_config_dict_yaml", timeout=30)
        if status != 200:
            return {}
        served = yaml.safe_load(body) if isinstance(body, str) else body
        return instance_urls(served) if isinstance(served, dict) else {}

    def wait_ready(self, timeout: float, alive: Any) -> None:
        """0.7's head answers ``/health`` 200 once every server (and the model) is ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError("gym env start exited")
            with contextlib.suppress(OSError):
                if http_json(self.head + "/health", timeout=5)[0] == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"NeMo Gym's head server not ready after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        ours = _session_processes(self.proc.pid)
        if self.proc.poll() is None:
            # SIGINT is how NeMo Gym shuts down: it stops its servers and its Ray.
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        # NeMo Gym signals each server's bash, not the server (0.4 and 0.7 alike): what
        # survives goes by PID.
        ours += _session_processes(self.proc.pid)
        kill_pids(ours)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.exit_code = self.proc.returncode
        self.proc = None
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def _session_processes(sid: int) -> list[psutil.Process]:
    """Processes of session ``sid`` and their descendants (Ray may start its own sessions)."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) == sid:
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
    return list(found.values())


def kill_pids(procs: list[psutil.Process], grace: float = 3.0) -> None:
    """Terminate these processes (those still alive), then kill what is left."""
    live = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.terminate()
                live.append(proc)
    _, alive = psutil.wait_procs(live, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)


@contextlib.contextmanager
def gym_stack(
    workspace: Workspace, config: dict[str, Any], **options: Any
) -> Iterator[dict[str, str]]:
    stack = GymStack(workspace, config, **options)
    urls = stack.start()
    try:
        yield urls
    finally:
        stack.stop()
