"""The code environment's sandbox against adversarial solutions. Each test would hang, crash or
compromise this process (the server runs in it) without the limit it shows; each program runs
under the sandbox's limits, bounded in time."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollgym.envs.code.sandbox import probe_isolation
from rollgym.envs.code.server import CodeEnv
from rollgym.testing import serve_server
from tests.support.waiting import wait_until

from .env_client import EnvClient

pytestmark = pytest.mark.timeout(90)
LIMITS = {"wall_seconds": 2.0, "cpu_seconds": 1, "parallel": 2}
ISOLATED = probe_isolation().namespaces
needs_namespaces = pytest.mark.skipif(not ISOLATED, reason="unshare namespaces unavailable")


def solution(code: str) -> str:
    return f"My solution:\n```python\n{code}\n```"


def stdio_row(inputs: list[str], outputs: list[str], **meta: Any) -> dict[str, Any]:
    tests = {"inputs": inputs, "outputs": outputs}
    return {
        "responses_create_params": {"input": "solve"},
        "verifier_metadata": {"unit_tests": tests, **meta},
    }


def assert_row(*asserts: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "solve"},
        "verifier_metadata": {"unit_tests": {"asserts": list(asserts)}},
    }


async def verify(client: EnvClient, row: dict[str, Any], code: str) -> dict[str, Any]:
    status, body = await client.verify(row, solution(code))
    assert status == 200, body
    return dict(body)


async def still_serving(client: EnvClient) -> None:
    # An honest run may miss its wall-clock limit on a machine this busy (CI beside stress):
    # that verdict is asked again, a few times; any other verdict, or a server error, fails.
    for _ in range(3):
        status, body = await verify_ok(client)
        assert status == 200, body
        if body["reward"] == 1.0 or body.get("test_results") != ["time_limit"]:
            break
        await asyncio.sleep(1.0)
    assert body["reward"] == 1.0, body


async def verify_ok(client: EnvClient) -> tuple[int, Any]:
    return await client.verify(stdio_row(["2\n"], ["4\n"]), solution("print(int(input()) * 2)"))


@pytest.fixture
async def code_env(connect: Callable[[str], EnvClient]) -> Any:
    async with serve_server(CodeEnv, name="code", options=LIMITS) as (url, server):
        yield connect(url), server


async def test_correct_and_wrong_solutions_and_scoring(code_env: Any) -> None:
    client, _ = code_env
    row = stdio_row(["1 2\n", "3 4\n"], ["3\n", "7\n"])
    good = await verify(client, row, "a, b = map(int, input().split())\nprint(a + b)")
    assert good["reward"] == 1.0 and good["test_results"] == ["passed", "passed"]
    assert good["scores"] == {"tests": 1.0, "all_tests": 1.0, "has_code": 1.0}
    # Right on one test of two: all-or-nothing by default, the fraction when the row says so.
    half = "a, b = map(int, input().split())\nprint(3)"
    assert (await verify(client, row, half))["reward"] == 0.0
    fraction = stdio_row(["1 2\n", "3 4\n"], ["3\n", "7\n"], scoring="fraction")
    scored = await verify(client, fraction, half)
    assert scored["reward"] == 0.5 and scored["tests_passed"] == 1
    status, no_code = await client.verify(row, "I cannot solve this.")
    assert status == 200 and no_code["reward"] == 0.0 and no_code["extracted_model_code"] is None


async def test_call_based_and_assert_tests(code_env: Any) -> None:
    client, _ = code_env
    call_row = {
        "responses_create_params": {"input": "solve"},
        "verifier_metadata": {
            "unit_tests": {
                "fn_name": "add",
                "inputs": ["1\n2", "[1]\n[2]"],
                "outputs": ["3", "[1, 2]"],
            }
        },
    }
    assert (await verify(client, call_row, "def add(a, b):\n    return a + b"))["reward"] == 1.0
    assert (await verify(client, call_row, "def add(a, b):\n    return a"))["reward"] == 0.0
    row = assert_row("assert double(2) == 4", "assert double(-1) == -2")
    assert (await verify(client, row, "def double(x):\n    return 2 * x"))["reward"] == 1.0


async def test_a_malformed_row_is_refused_not_scored(code_env: Any) -> None:
    client, _ = code_env
    status, body = await client.verify({"responses_create_params": {"input": "x"}}, solution("1"))
    assert status == 422 and body["error"]["type"] == "invalid_request"
    bad = stdio_row(["1\n"], [])
    status, body = await client.verify(bad, solution("1"))
    assert status == 422 and "outputs" in body["error"]["message"]


@pytest.mark.parametrize(
    ("name", "code", "expected"),
    [
        ("infinite loop", "while True:\n    pass", {"runtime_error", "time_limit"}),
        ("sleeping past the limit", "import time\ntime.sleep(3600)", {"time_limit"}),
        ("10 GB allocation", "x = bytearray(10 * 2**30)\nprint(len(x))", {"runtime_error"}),
        (
            "1 GB of output",
            "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)",
            {"output_limit"},
        ),
        (
            "fork bomb",
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            {"time_limit", "runtime_error"},
        ),
    ],
)
async def test_resource_abuse_fails_the_test_within_the_limits(
    code_env: Any, name: str, code: str, expected: set[str]
) -> None:
    client, _ = code_env
    # The verdict names the limit that stopped the program (the test's timeout bounds the
    # wait): no wall-clock bound here, which a busy machine could break.
    result = await verify(client, stdio_row(["1\n"], ["1\n"]), code)
    assert result["reward"] == 0.0 and set(result["test_results"]) <= expected, result
    await still_serving(client)


async def test_a_fork_bomb_leaves_no_process_behind(code_env: Any) -> None:
    client, server = code_env
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    await verify(client, stdio_row(["1\n"], ["1\n"]), bomb)
    uids = {server.options.uid_base + s for s in range(server.options.parallel)}
    if ISOLATED:  # without namespaces, a child that left the process group may live on
        await wait_until(lambda: not _processes_of(uids), 30, "the bomb's processes gone")


def _processes_of(uids: set[int]) -> list[int]:
    """The live processes of this test's own server that run as one of ``uids``. Only
    descendants of this process count: another process on the machine (another rollgym's
    sandbox) may use the same uids. In a PID namespace an orphan is reparented to the
    namespace's init, itself a descendant; once that init is gone the kernel kills the rest."""
    parents: dict[int, int] = {}
    candidates = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(ln.split(":", 1) for ln in status.read_text().splitlines() if ":" in ln)
        except OSError:
            continue  # gone meanwhile
        pid = int(status.parent.name)
        parents[pid] = int(fields.get("PPid", "0"))
        uid = int(fields.get("Uid", "-1").split()[0])
        if uid in uids and "Z" not in fields.get("State", ""):
            candidates.append(pid)
    return [pid for pid in candidates if _descends_from(pid, os.getpid(), parents)]


def _descends_from(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = parents.get(pid, 0)
    return False


@needs_namespaces
async def test_the_servers_environment_is_not_visible(
    code_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = code_env
    monkeypatch.setenv("ROLLGYM_TEST_SECRET", "hunter2-secret")
    pid = os.getpid()
    code = (
        "import os\n"
        "leak = 'hunter2-secret' in str(os.environ)\n"
        f"try:\n    leak = leak or b'hunter2' in open('/proc/{pid}/environ', 'rb').read()\n"
        "except OSError:\n    pass\n"
    )
    result = await verify(client, assert_row("assert not leak"), code)
    assert result["reward"] == 1.0, result


@needs_namespaces
async def test_nothing_outside_the_work_dir_can_be_written(code_env: Any, tmp_path: Path) -> None:
    client, _ = code_env
    target = tmp_path / "pwned.txt"
    os.chmod(tmp_path, 0o777)  # even a world-writable dir of the host is out of reach
    code = (
        "written = []\n"
        f"for path in [{str(target)!r}, '/etc/pwned', {str(Path.cwd() / 'pwned')!r}]:\n"
        "    try:\n        open(path, 'w').write('x')\n        written.append(path)\n"
        "    except OSError:\n        pass\n"
        "open('mine.txt', 'w').write('the work dir is writable')\n"
    )
    result = await verify(client, assert_row("assert not written, written"), code)
    assert result["reward"] == 1.0, result
    assert not await asyncio.to_thread(target.exists)
    assert not await asyncio.to_thread(Path("/etc/pwned").exists)


@needs_namespaces
async def test_killing_its_parent_or_the_server_does_nothing(code_env: Any) -> None:
    client, _ = code_env
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, 1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print('done')\n"
    )
    await verify(client, stdio_row(["\n"], ["done\n"]), code)
    await still_serving(client)  # and this test process, the server's, is alive


@needs_namespaces
async def test_no_network_even_to_the_server_itself(code_env: Any) -> None:
    client, _ = code_env
    port = int(client.url.rsplit(":", 1)[1])
    code = (
        "import socket\nconnected = False\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
        "    connected = True\nexcept OSError:\n    pass\n"
    )
    result = await verify(client, assert_row("assert not connected"), code)
    assert result["reward"] == 1.0, result


async def test_a_sandbox_that_cannot_run_is_a_typed_failure(
    connect: Callable[[str], EnvClient],
) -> None:
    # An impossible uid: the launcher's setup fails before any of the program runs.
    options = {**LIMITS, "uid_base": 2**32 - 1}
    async with serve_server(CodeEnv, name="code", options=options) as (url, server):
        if not server._sandbox or not server._sandbox.isolation.switch_uid:
            pytest.skip("the sandbox switches uids only when run as root")
        status, body = await connect(url).verify(stdio_row(["1\n"], ["1\n"]), solution("print(1)"))
    assert status == 500, body
    assert body["error"]["type"] == "sandbox_error" and "setup failed" in body["error"]["message"]


async def test_sandbox_seconds_are_the_runs_cpu_seconds(
    connect: Callable[[str], EnvClient],
) -> None:
    # A program that burns 0.6 s of CPU, and one that sleeps 1.5 s: the first's sandbox_s is at
    # least what it burned, the second's far less than the wall time it held its slot. The
    # wall limit is loose, so a busy machine slows them without killing them.
    options = {**LIMITS, "wall_seconds": 20.0, "cpu_seconds": 5}
    row = stdio_row([""], ["done\n"])
    burn = "import time\nwhile time.process_time() < 0.6:\n    pass\nprint('done')"
    sleep = "import time\ntime.sleep(1.5)\nprint('done')"
    async with serve_server(CodeEnv, name="code", options=options) as (url, _):
        client = connect(url)
        burned = await verify(client, row, burn)
        slept = await verify(client, row, sleep)
    assert burned["reward"] == 1.0 and slept["reward"] == 1.0, (burned, slept)
    assert burned["sandbox_s"] >= 0.6, burned
    assert slept["sandbox_s"] < 1.0, slept


async def test_runs_stopped_at_their_wall_limit_still_count_their_cpu_seconds(
    connect: Callable[[str], EnvClient],
) -> None:
    # Six runs, three at a time: each burns 0.3 s of CPU, then sleeps past its wall limit and
    # is killed there. In its own namespaces, killing unshare and the launcher at once lost the
    # launcher's accounting whenever unshare died first (7 of 12 such runs here).
    options = {**LIMITS, "wall_seconds": 2.5, "cpu_seconds": 5, "parallel": 3}
    row = stdio_row([""] * 6, ["done\n"] * 6)
    code = "import time\nwhile time.process_time() < 0.3:\n    pass\ntime.sleep(60)"
    async with serve_server(CodeEnv, name="code", options=options) as (url, _):
        result = await verify(connect(url), row, code)
    assert result["test_results"] == ["time_limit"] * 6, result
    assert result["sandbox_s"] >= 6 * 0.3, result
