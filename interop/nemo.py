"""Run the real NeMo Gym 0.4.0 (in its own Python 3.12 venv) next to rollgym, on 127.0.0.1.

- ``Workspace``: the directory ``gym env start`` runs in. NeMo Gym would build one uv venv per
  server (network); ``+skip_venv_if_present=true +uv_venv_dir=DIR`` makes it use
  ``DIR/<type>/<name>/.venv`` instead, so each server gets a link to a venv we already have:
  NeMo Gym's own servers the interop venv, the rollgym agent shim rollgym's venv.
- ``GymStack``: ``gym env start`` for a generated config; stopped by PID. It starts a local Ray
  (``RAY_ADDRESS=local``, so it never joins a cluster someone else runs on this machine).
- ``server_entry``: a server instance of NeMo Gym's config, from its own config files, on a
  port we chose (so tests know where it listens without asking the head server).
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
INTEROP_VENV = Path(os.environ.get("INTEROP_VENV", ROOT / ".interop-venv"))
ROLLGYM_VENV = ROOT / ".venv"
SHIM_DIR = Path(__file__).with_name("shim")
# rollgym servers that ``gym env start`` launches as its own (server type -> shim name).
SHIMS = {"responses_api_agents": "rollgym_agent", "resources_servers": "rollgym_env"}


def site_packages(venv: Path = INTEROP_VENV) -> Path:
    """Where NeMo Gym's servers are installed (its ``PARENT_DIR`` in a wheel install)."""
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if not found or not (found[0] / "nemo_gym").is_dir():
        raise RuntimeError(f"no NeMo Gym in {venv}: run interop/setup.sh first")
    return found[0]


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


def nemo_configs(resources_server: str) -> dict[str, Any]:
    """NeMo Gym's own config files of one resources server, merged (instance name -> entry)."""
    merged: dict[str, Any] = {}
    for path in sorted(
        (site_packages() / "resources_servers" / resources_server).glob("configs/*.yaml")
    ):
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
        "responses_api_models",
        "openai_model",
        port,
        openai_base_url=base_url,
        openai_api_key="interop-unused",  # the scripted model reads no key
        openai_model="rollgym-scripted",
        openai_default_headers={},
    )


def simple_agent(port: int, resources: str, model: str = "policy_model") -> dict[str, Any]:
    return server_entry(
        "responses_api_agents",
        "simple_agent",
        port,
        resources_server=ref("resources_servers", resources),
        model_server=ref("responses_api_models", model),
    )


def rollgym_agent(port: int, resources: str, impl: str = "tool_agent") -> dict[str, Any]:
    """rollgym's agent as a NeMo Gym agent server (started by ``gym env start`` via the shim)."""
    return server_entry(
        "responses_api_agents",
        "rollgym_agent",
        port,
        impl=impl,
        resources_server=ref("resources_servers", resources),
        model_server=ref("responses_api_models", "policy_model"),
    )


def rollgym_env(port: int, impl: str, **options: Any) -> dict[str, Any]:
    """A rollgym environment as a NeMo Gym resources server (``gym env start`` via the shim)."""
    return server_entry(
        "resources_servers", "rollgym_env", port, impl=impl, options=options, domain="other"
    )


def instance_urls(config: dict[str, Any]) -> dict[str, str]:
    """Instance name -> URL of every server instance of a NeMo Gym config."""
    urls = {}
    for name, entry in config.items():
        if not isinstance(entry, dict):  # a top-level value (interpolated by server configs)
            continue
        inner = next(iter(next(iter(entry.values())).values()))
        urls[name] = f"http://{inner['host']}:{inner['port']}"
    return urls


# -- the workspace and the stack -----------------------------------------------------------


@dataclass
class Workspace:
    """A directory for ``gym env start``: its cwd, config, venv links, logs and Ray temp dir."""

    path: Path

    def __post_init__(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        # NeMo Gym resolves a server dir in the cwd first: rollgym's shims live here.
        for kind, name in SHIMS.items():
            shim = self.path / kind / name
            if not shim.exists():
                shim.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(SHIM_DIR / name, shim)

    @property
    def venvs(self) -> Path:
        return self.path / "venvs"

    def link_venv(self, kind: str, name: str) -> None:
        """``uv_venv_dir/<kind>/<name>/.venv``: rollgym's venv for the shim, else the interop one."""
        target = ROLLGYM_VENV if name in SHIMS.values() else INTEROP_VENV
        link = self.venvs / kind / name / ".venv"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(target.resolve(), target_is_directory=True)


@dataclass
class GymStack:
    """``gym env start`` for ``config``; ``start()`` waits for every server, ``stop()`` ends
    every process it started, by PID."""

    workspace: Workspace
    config: dict[str, Any]
    head_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    ray_tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rgi-", dir="/tmp"))

    def args(self) -> list[str]:
        config_file = self.workspace.path / "interop_config.yaml"
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [
            str(INTEROP_VENV / "bin" / "gym"),
            "env",
            "start",
            f"+config_paths=[{config_file}]",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={self.workspace.venvs}",
            f"+head_server={{host: 127.0.0.1, port: {self.head_port}}}",
            f"+nemo_gym_log_dir={self.workspace.path / 'logs'}",
        ]

    def start(self, timeout: float = 180.0) -> dict[str, str]:
        for entry in self.config.values():
            if not isinstance(entry, dict):
                continue
            kind, inner = next(iter(entry.items()))
            self.workspace.link_venv(kind, next(iter(inner)))
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
        try:
            for url in urls.values():
                port = int(url.rsplit(":", 1)[1])
                wait_listening(port, timeout=timeout, alive=lambda: self.proc.poll() is None)
            wait_listening(self.head_port, timeout=30, alive=lambda: self.proc.poll() is None)
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log.read_text(errors="replace")[-4000:]
            self.stop()
            raise RuntimeError(f"gym env start failed: {exc}\n--- log tail ---\n{tail}") from exc
        except BaseException:  # Ctrl-C while waiting: leave nothing running
            self.stop()
            raise
        return urls

    def stop(self) -> None:
        if self.proc is None:
            return
        ours = _session_processes(self.proc.pid)
        if self.proc.poll() is None:
            # SIGINT is how NeMo Gym shuts down: it stops its servers and its Ray.
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        # NeMo Gym signals each server's bash, not the server; what survives goes by PID.
        ours += _session_processes(self.proc.pid)
        kill_pids(ours)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
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
def gym_stack(workspace: Workspace, config: dict[str, Any]) -> Iterator[dict[str, str]]:
    stack = GymStack(workspace, config)
    urls = stack.start()
    try:
        yield urls
    finally:
        stack.stop()
