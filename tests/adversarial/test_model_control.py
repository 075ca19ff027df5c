"""Red team: another local user against a model server's control endpoints. Weight pushes,
pauses and resumes need the owner's control token (``rollgym.control_token``), kept in a file
only the owner can read; a push names a checkpoint under the weights root, and a path outside
it gets the same answer as a missing one, so the answer tells nothing about what exists."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollgym.control_token import (
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    authorization,
    control_token,
    token_file,
)
from rollgym.errors import ConfigError
from rollgym.integrations.weights import LocalModelWeights
from rollgym.models.tiny import build_tiny_model
from rollgym.testing import serve_server
from rollgym.trainer.policy_control import PolicyControl
from rollgym.wire import PAUSE_ENDPOINT, POLICY_ENDPOINT, RESUME_ENDPOINT, WEIGHTS_ENDPOINT

pytestmark = pytest.mark.timeout(90)

LOCAL = "rollgym.models.local:LocalModel"
NOBODY = 65534
TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(served, newer, outside): two models under one root, a third outside it."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("root")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    return (
        build_tiny_model(root / "served", seed=0),
        build_tiny_model(root / "newer", seed=1),
        build_tiny_model(elsewhere / "outside", seed=2),
    )


async def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.post(url, json=body, headers=headers) as answer,
    ):
        return answer.status, orjson.loads(await answer.read())


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.get(url) as answer:
        assert answer.status == 200
        return orjson.loads(await answer.read())


async def test_a_push_without_the_token_or_with_another_is_refused_and_nothing_changes(
    models: tuple[Path, Path, Path],
) -> None:
    served, newer, _ = models
    push = {"path": str(newer), "version": 7}
    async with serve_server(LOCAL, name="model", options={"model_dir": str(served)}) as (url, _):
        status, none = await _post(url + WEIGHTS_ENDPOINT, push)
        assert status == 401, none
        assert "control token" in none["error"]["message"]
        status, wrong = await _post(
            url + WEIGHTS_ENDPOINT, push, authorization("x" * 43)
        )  # a well-formed guess
        assert status == 403, wrong
        status, basic = await _post(url + WEIGHTS_ENDPOINT, push, {"authorization": "Basic eDp5"})
        assert status == 401, basic
        served_now = await _get(url + WEIGHTS_ENDPOINT)
        assert served_now == {"rollgym_policy_version": 0, "path": str(served)}
        # The owner's client finds the token by itself.
        assert (await LocalModelWeights(url, timeout=30).push(newer, 7)).version == 7
        assert (await _get(url + WEIGHTS_ENDPOINT))["rollgym_policy_version"] == 7


async def test_a_pause_or_resume_without_the_token_is_refused() -> None:
    async with serve_server("rollgym.models.scripted:ScriptedModel", name="model") as (url, _):
        assert (await _post(url + PAUSE_ENDPOINT, {"timeout_s": 600}))[0] == 401
        assert (await _post(url + RESUME_ENDPOINT, {"version": 9}))[0] == 401
        assert (await _post(url + RESUME_ENDPOINT, {"version": 9}, authorization("y" * 43)))[
            0
        ] == 403
        state = await _get(url + POLICY_ENDPOINT)
        assert (state["paused"], state["version"]) == (False, 0)
        # The trainer's client sends the token.
        control = PolicyControl([url], call_timeout=10)
        try:
            await control.pause(timeout_s=60)
            assert (await _get(url + POLICY_ENDPOINT))["paused"] is True
            await control.resume(3)
        finally:
            await control.aclose()
        state = await _get(url + POLICY_ENDPOINT)
        assert (state["paused"], state["version"]) == (False, 3)


async def test_a_path_outside_the_root_and_a_missing_path_get_the_same_answer(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    served, newer, outside = models
    root = served.parent
    linked = root / f"link-{tmp_path.name}"  # inside the root, pointing out of it
    linked.symlink_to(outside)
    shards = root / f"shards-{tmp_path.name}"  # a directory whose file links out of the root
    shards.mkdir()
    (shards / "model.safetensors").symlink_to(outside / "model.safetensors")
    token = authorization(control_token())
    probes = [
        str(outside),  # a real checkpoint, outside the root
        str(outside / "model.safetensors"),
        "/root/.ssh",
        "/etc/shadow",
        str(tmp_path / "missing"),
        str(root / "missing"),
        str(linked),
        str(shards),
        f"{root}/../{outside.parent.name}/{outside.name}",
    ]
    async with serve_server(LOCAL, name="model", options={"model_dir": str(served)}) as (url, _):
        answers = [
            await _post(url + WEIGHTS_ENDPOINT, {"path": p, "version": 1}, token) for p in probes
        ]
        assert {status for status, _ in answers} == {400}, answers
        messages = {a["error"]["message"] for _, a in answers}
        assert len(messages) == 1, messages
        (message,) = messages
        assert "not a checkpoint under the weights root" in message
        for leaked in ("ssh", "shadow", "elsewhere", "outside", "missing", "No such"):
            assert leaked not in message
        assert (await _get(url + WEIGHTS_ENDPOINT))["rollgym_policy_version"] == 0
        # Under the root, a checkpoint loads.
        status, pushed = await _post(
            url + WEIGHTS_ENDPOINT, {"path": str(newer), "version": 1}, token
        )
        assert status == 200, pushed


def test_the_token_file_is_the_owners_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "state" / "control-token"))
    token = control_token()
    path = token_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().strip() == token and control_token() == token  # kept
    path.chmod(0o644)  # readable by others: not a secret any more
    with pytest.raises(ConfigError, match="chmod 600"):
        control_token()
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")  # a planted link is not followed
    (tmp_path / "elsewhere").write_text("a" * 40)
    (tmp_path / "elsewhere").chmod(0o600)
    with pytest.raises(ConfigError, match="cannot read"):
        control_token()


def test_a_token_directory_open_to_others_is_refused_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)  # anyone may put a file of their own where the token goes
    monkeypatch.setenv(ENV_TOKEN_FILE, str(folder / "control-token"))
    with pytest.raises(ConfigError, match=rf"is open to others \(mode 0777\).*chmod 700 {folder}$"):
        control_token()
    assert list(folder.iterdir()) == []  # no token written there
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777  # checked, never changed
    folder.chmod(0o700)  # the fix the error gives
    token = control_token()
    assert (folder / "control-token").read_text().strip() == token


def test_a_token_directory_that_is_a_link_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "state" / "control-token"))
    with pytest.raises(ConfigError, match="control token's directory is a symbolic link"):
        control_token()
    assert list(real.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user's")
def test_a_token_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(theirs / "control-token"))
    with pytest.raises(ConfigError, match=rf"is another user's.*set {ENV_TOKEN_FILE} to a file"):
        control_token()
    assert list(theirs.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a probe as another user")
async def test_another_user_can_neither_read_the_token_nor_push(
    models: tuple[Path, Path, Path],
) -> None:
    served, newer, _ = models
    async with serve_server(LOCAL, name="model", options={"model_dir": str(served)}) as (url, _):
        control_token()  # the file exists, as serve-model creates it at start
        probe = textwrap.dedent(
            f"""
            import encodings.idna, json, os, sys, urllib.error, urllib.request
            # Everything imported first: the interpreter's files are root's alone.
            os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
            result = {{}}
            try:
                open({str(token_file())!r}).read()
                result["read"] = "read"
            except PermissionError:
                result["read"] = "denied"
            push = json.dumps({{"path": {str(newer)!r}, "version": 7}}).encode()
            request = urllib.request.Request(
                {url + WEIGHTS_ENDPOINT!r}, push, {{"content-type": "application/json"}}
            )
            try:
                urllib.request.urlopen(request, timeout=20)
                result["push"] = 200
            except urllib.error.HTTPError as exc:
                result["push"] = exc.code
            print(json.dumps(result))
            """
        )
        # On a thread: this loop serves the model the probe calls.
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", probe], capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        assert orjson.loads(done.stdout) == {"read": "denied", "push": 401}
        assert (await _get(url + WEIGHTS_ENDPOINT))["rollgym_policy_version"] == 0
