"""Issue 27's smaller holes, tried as a hostile policy or a hostile upstream would.

- a server process's environment (and anything else a child of it can read) holds the run's
  credentials;
- a ``base_url`` password that an upstream echoes in any form reaches the records, the logs,
  the terminal or a 502 body;
- a server named like a path writes its log outside ``--output``;
- links planted in the output directory are written through.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.config import parse_config
from rollgym.errors import ConfigError
from rollgym.launch import Supervisor
from rollgym.testing import serve_asgi, serve_server

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")

USER = "trainer"
PASSWORD = "Zq7 p@ss:w/rd!x9"  # URL-special characters, so its encoded and decoded forms differ
PAIR = f"{USER}:{PASSWORD}"
URL_PASSWORD = quote(PASSWORD, safe="")
URL_PAIR = f"{USER}:{URL_PASSWORD}"
KEY = "PLANTEDHOLEKEY0123456789abcdef"
KEY_ENV = "ROLLGYM_HOLE_KEY"


def _b64(data: bytes, urlsafe: bool = False) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(data).decode()


def echoed_forms() -> dict[str, str]:
    """Every form in which an upstream may echo the credentials it was sent."""
    pair = PAIR.encode()
    longer = f'{{"user": "{USER}", "auth": "{PAIR}", "seen": true}}'.encode()
    return {
        "raw password": PASSWORD,
        "encoded password": URL_PASSWORD,
        "lower-case encoded password": URL_PASSWORD.lower(),
        "pair": PAIR,
        "encoded pair": URL_PAIR,
        "pair encoded whole": quote(PAIR, safe=""),
        "base64": _b64(pair),
        "base64 unpadded": _b64(pair).rstrip("="),
        "urlsafe base64": _b64(pair, urlsafe=True),
        # The pair inside a longer base64 run, at each of the three byte alignments.
        "inside base64 (0)": _b64(longer),
        "inside base64 (1)": _b64(b"x" + longer),
        "inside base64 (2)": _b64(b"xy" + longer),
        "base64 of the password": _b64(PASSWORD.encode()),
        "url": f"http://{URL_PAIR}@gpu.example:8000/v1",
        "decoded url": f"http://{PAIR}@gpu.example:8000/v1",
    }


def must_not_appear() -> dict[str, str]:
    """What must appear nowhere: the secrets themselves, each also as JSON writes it."""
    # The pair and the password in base64 can only be recognised whole; the longer runs are
    # checked for the pair's own base64 only (their other characters encode other bytes).
    secrets = {
        "raw password": PASSWORD,
        "encoded password": URL_PASSWORD,
        "lower-case encoded password": URL_PASSWORD.lower(),
        "encoded pair": URL_PAIR,
        "base64": _b64(PAIR.encode()).rstrip("="),
        "urlsafe base64": _b64(PAIR.encode(), urlsafe=True).rstrip("="),
        "base64 of the password": _b64(PASSWORD.encode()).rstrip("="),
    }
    longer = f'{{"user": "{USER}", "auth": "{PAIR}", "seen": true}}'.encode()
    start = longer.index(PAIR.encode())
    for shift, prefix in enumerate((b"", b"x", b"xy")):
        # The characters of the run that encode the pair's bytes alone.
        offset = len(prefix) + start
        first = -(-offset * 8 // 6)
        last = (offset + len(PAIR)) * 8 // 6
        secrets[f"pair inside base64 ({shift})"] = _b64(prefix + longer)[first:last]
    out = dict(secrets)
    for name, value in secrets.items():
        out[f"{name} (JSON)"] = json.dumps(value)[1:-1]
    return out


def assert_clean(text: str, where: str) -> None:
    for name, value in must_not_appear().items():
        assert value not in text, f"{where} holds the {name}: {value!r}"


def echoing_upstream(seen: list[str]) -> Starlette:
    """An OpenAI-compatible upstream that fails every call and echoes the credentials it was
    sent, decoded, in every form, in its body and its headers."""

    async def chat(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        seen.append(auth)
        forms = echoed_forms()
        message = f"invalid credentials {PASSWORD} for {PAIR} ({forms['url']})"
        body = {"error": {"message": message, "forms": forms, "authorization": auth}}
        headers = {f"x-echo-{i}": v for i, v in enumerate(forms.values())}
        headers["www-authenticate"] = f'Basic realm="{PAIR}"'
        return JSONResponse(body, status_code=500, headers=headers)

    routes = [Route(p, chat, methods=["POST"]) for p in ("/v1/chat/completions", "/v1/responses")]
    return Starlette(routes=routes)


def stack(base_url: str, **collect: Any) -> dict[str, Any]:
    return {
        "servers": {
            "model": {
                "kind": "model",
                "impl": "openai_proxy",
                "options": {
                    "base_url": base_url,
                    "upstream_retry": {"max_attempts": 2, "backoff_initial": 0.01},
                },
            },
            "env": {"kind": "resources", "impl": "echo"},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "model", "resources": "env"},
            },
        },
        "collect": {"concurrency": 2, **collect},
    }


def write_tasks(path: Path, count: int) -> Path:
    rows = ({"responses_create_params": {"input": f"q{i}"}, "expected_answer": "x"} for i in
            range(count))  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


async def rollgym(*args: str | Path) -> tuple[int, str]:
    """Run the real ``rollgym`` command without blocking this loop; (exit code, its output)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}
    proc = await asyncio.create_subprocess_exec(
        ROLLGYM, *map(str, args), env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def logs_under(root: Path) -> list[Path]:
    return sorted(root.rglob("*.log"))


def credentialed(url: str) -> str:
    return url.replace("http://", f"http://{URL_PAIR}@") + "/v1"


# -- 1. the server processes' environment ------------------------------------------------------


def _readable(pid: int) -> dict[str, bytes]:
    """What a process of the same user can read of ``pid`` without ptrace: its environment,
    its command line, and every file it holds open."""
    proc = Path(f"/proc/{pid}")
    found = {"environ": (proc / "environ").read_bytes(), "cmdline": (proc / "cmdline").read_bytes()}
    for fd in (proc / "fd").iterdir():
        try:
            target = os.readlink(fd)
            if target.startswith(("socket:", "pipe:", "anon_inode:")) or target == "/dev/null":
                found[f"fd {fd.name} ({target})"] = target.encode()
                continue
            with open(fd, "rb") as held:
                found[f"fd {fd.name} ({target})"] = held.read(1 << 20)
        except OSError:
            continue  # closed meanwhile, or not a file
    return found


async def test_no_server_process_lets_a_child_read_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    seen: list[str] = []
    async with serve_asgi(echoing_upstream(seen)) as upstream:
        data = stack(credentialed(upstream))
        # A second model server whose key comes from the environment: it alone may know it.
        data["servers"]["keyed"] = {
            "kind": "model",
            "impl": "openai_proxy",
            "options": {
                "base_url": upstream + "/v1",
                "api_key_env": KEY_ENV,
                "upstream_retry": {"max_attempts": 1},
            },
        }
        cfg = parse_config(data, str(tmp_path / "c.yaml"))
        supervisor = Supervisor(cfg, log_dir=tmp_path / "logs")
        try:
            urls = await supervisor.start()
            pids = supervisor.pids()
            assert len(pids) == 4
            for pid in pids:
                for what, content in _readable(pid).items():
                    for secret in (PASSWORD, URL_PASSWORD, URL_PAIR, KEY):
                        assert secret.encode() not in content, (
                            f"pid {pid}'s {what} holds {secret!r}"
                        )
            # The key left the environment, not the server that needs it.
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                async with http.post(f"{urls['keyed'][0]}/v1/chat/completions", json=payload):
                    pass
        finally:
            await supervisor.stop()
    assert seen == [f"Bearer {KEY}"]


# -- 2. a base_url password echoed by the upstream ---------------------------------------------


async def test_an_echoed_password_reaches_no_file_and_no_terminal(tmp_path: Path) -> None:
    seen: list[str] = []
    async with serve_asgi(echoing_upstream(seen)) as upstream:
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump(stack(credentialed(upstream))))
        tasks = write_tasks(tmp_path / "tasks.jsonl", 4)
        out = tmp_path / "out"
        code, terminal = await rollgym(
            "run", config, "-i", tasks, "-o", out, "--log-level", "DEBUG", "--no-progress"
        )
    assert seen and seen[0] == "Basic " + _b64(PAIR.encode())  # the upstream was sent them
    assert code == 1, terminal
    assert_clean(terminal, "the terminal")
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"failures.jsonl", "model.log", "agent.log", "run.json"} <= {p.name for p in files}
    assert (out / "logs" / "model.log").stat().st_size > 0
    for path in files:
        assert_clean(path.read_text(errors="replace"), str(path))
    assert "REDACTED" in (out / "failures.jsonl").read_text()  # the echo was there, scrubbed


async def test_an_echoed_password_is_not_in_the_502_body_or_the_warning_log(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    async with serve_asgi(echoing_upstream(seen)) as upstream:
        cfg = parse_config(stack(credentialed(upstream)), str(tmp_path / "c.yaml"))
        supervisor = Supervisor(cfg, log_dir=tmp_path / "logs", log_level="WARNING")
        try:
            urls = await supervisor.start()
            bodies = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                model = urls["model"][0]
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                for path, payload in (
                    ("/v1/chat/completions", chat),
                    ("/v1/responses", {"model": "m", "input": "hi"}),
                ):
                    async with http.post(model + path, json=payload) as answer:
                        assert answer.status == 502
                        bodies.append(await answer.text())
                        assert_clean(str(dict(answer.headers)), f"the headers of {path}")
        finally:
            await supervisor.stop()
    assert len(seen) >= 2
    for body in bodies:
        assert_clean(body, "a 502 body")
    assert "REDACTED" in bodies[0]
    log = (tmp_path / "logs" / "model.log").read_text()
    assert "WARNING" in log  # the failure was logged, at WARNING, with the upstream's message
    assert_clean(log, "model.log")


async def test_an_api_key_echoed_encoded_is_not_in_the_502_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The header's key, echoed in other forms than its own (the proxy knew only the exact one).
    key = "k3y/with+special=chars0123"
    monkeypatch.setenv(KEY_ENV, key)
    forms = [quote(key, safe=""), _b64(key.encode()), _b64(f"{key}:".encode()),
             key.replace("/", "\\/")]  # fmt: skip

    async def chat(request: Request) -> Response:
        return JSONResponse({"error": {"message": " | ".join(forms)}}, status_code=401)

    upstream_app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    async with serve_asgi(upstream_app) as upstream:
        options = {"base_url": upstream + "/v1", "api_key_env": KEY_ENV}
        async with (
            serve_server("openai_proxy", name="model", options=options) as (url, _),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{url}/v1/chat/completions", json=payload) as answer:
                body = await answer.text()
    assert "REDACTED" in body
    for form in forms:
        assert form not in body and json.dumps(form)[1:-1] not in body, form


# -- 3. server names are identifiers ------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../../x", "a/b", "..", ".hidden", "x..y", "", "-x", "a b", "x" * 65, "tab\t"]
)
def test_a_server_name_that_is_not_an_identifier_is_a_config_error(name: str) -> None:
    data = {"servers": {name: {"kind": "resources", "impl": "echo"}}}
    with pytest.raises(ConfigError) as info:
        parse_config(data, "cfg.yaml")
    message = str(info.value)
    assert "cfg.yaml" in message and "servers" in message and "name" in message, message


async def test_a_server_named_like_a_path_writes_nothing_outside_the_output(
    tmp_path: Path,
) -> None:
    base = tmp_path / "deep" / "er"
    base.mkdir(parents=True)
    config = base / "c.yaml"
    data = stack("http://127.0.0.1:9/v1")
    data["servers"]["../../x"] = data["servers"].pop("env")
    data["servers"]["agent"]["options"]["resources"] = "../../x"
    config.write_text(yaml.safe_dump(data))
    out = base / "out"
    code, terminal = await rollgym("run", config, "-i", write_tasks(base / "t.jsonl", 1), "-o", out)
    assert code == 2, terminal
    assert "../../x" in terminal and str(config) in terminal
    assert "Traceback" not in terminal
    assert logs_under(tmp_path) == []


# -- 4. links planted in the output directory ---------------------------------------------------


@pytest.mark.parametrize(
    "planted",
    ["logs", "rollouts.jsonl", "failures.jsonl", "tasks.jsonl", "run.json", "metrics.json",
     "run.json.tmp", "tasks.jsonl.tmp"],
)  # fmt: skip
async def test_a_link_planted_in_the_output_directory_is_refused(
    tmp_path: Path, planted: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    target = elsewhere if planted == "logs" else elsewhere / "target"
    (out / planted).symlink_to(target)  # dangling for a file: nothing "exists" there yet
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(stack("http://127.0.0.1:9/v1")))
    code, terminal = await rollgym("run", config, "-i", write_tasks(tmp_path / "t.jsonl", 1),
                                   "-o", out)  # fmt: skip
    assert code == 2, terminal
    assert planted in terminal and "link" in terminal, terminal
    assert "Traceback" not in terminal
    assert list(elsewhere.iterdir()) == [], "written through the link"
    assert (out / planted).is_symlink()  # left as found, for the person to look at


def test_a_log_link_planted_after_the_check_is_not_followed(tmp_path: Path) -> None:
    # Between the run directory's check and a server's (re)start, a link in logs/.
    from rollgym.launch.process import ServerProcess

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "env.log").symlink_to(elsewhere / "target")
    server = ServerProcess.bind("env", 0, "127.0.0.1", 0, log_path=logs / "env.log")
    try:
        cfg = parse_config({"servers": {"env": {"kind": "resources", "impl": "echo"}}})
        with pytest.raises(OSError):
            server.spawn(cfg.model_dump(mode="json"), {"env": [server.url]}, "WARNING")
    finally:
        server.kill()
        server.close()
    assert list(elsewhere.iterdir()) == []
