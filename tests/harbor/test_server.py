"""``impl: harbor`` served for real: the tools act in the session's container (deadline, bounded
output, exit status), the container holds no tests, no solution and no git history past HEAD,
and the tool-calling agent driving a model is the terminal agent."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.http import Target
from rollgym.testing import serve_server
from rollgym.wire import SESSION_HEADER
from tests.harbor.conftest import BUNDLED, needs_podman

pytestmark = [needs_podman, pytest.mark.timeout(240)]


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    for name in ("hello-file", "fix-failing-test"):
        shutil.copytree(BUNDLED / name, tmp_path / name)
    return tmp_path


def row(task: str, **params: Any) -> dict[str, Any]:
    instruction = (BUNDLED / task / "instruction.md").read_text()
    return {"responses_create_params": {"input": instruction, **params}, "harbor": {"task": task}}


@pytest.fixture
async def env(tasks: Path) -> AsyncIterator[str]:
    async with serve_server("harbor", name="tasks", options={"tasks_dir": str(tasks)}) as (url, _):
        yield url


async def test_tools_act_in_a_container_without_tests_solution_or_history(env: str) -> None:
    async with httpx.AsyncClient(base_url=env, timeout=120) as http:
        seeded = (await http.post("/seed_session", json=row("fix-failing-test"))).json()
        headers = {SESSION_HEADER: seeded["session_id"]}

        async def run(command: str, **kw: Any) -> dict[str, Any]:
            answer = await http.post(
                "/run_command", json={"command": command, **kw}, headers=headers
            )
            assert answer.status_code == 200, answer.text
            out: dict[str, Any] = answer.json()
            return out

        hidden = await run("ls -d /tests /solution /oracle 2>&1; ls /logs/verifier 2>&1; true")
        assert hidden["stdout"].count("No such file") == 4, hidden
        history = await run("git log --all --oneline | wc -l; git reflog | wc -l; git tag | wc -l")
        assert history["stdout"].split() == ["1", "0", "0"], history
        assert (await run("exit 3"))["exit_code"] == 3
        slow = await run("sleep 30", timeout=1)
        assert slow["timed_out"] and slow["exit_code"] is None
        flood = await run("head -c 1000000 /dev/zero | tr '\\0' x")
        assert flood["truncated"] and len(flood["stdout"]) <= 16384
        fed = await run("cat", stdin="from stdin")
        assert fed["stdout"] == "from stdin"

        read = await http.post("/read_file", json={"path": "/app/calc.py"}, headers=headers)
        assert "len(values) - 1" in read.json()["content"]
        twice = await http.post(
            "/edit_file", json={"path": "/app/calc.py", "old": "return", "new": "return"},
            headers=headers,
        )  # fmt: skip
        assert twice.status_code == 400 and "occurs 2 times" in twice.text
        # A result past the bound is refused before it is built (4 MB of 'a' times 2,000 would
        # be an 8 GB string in the shared server).
        await run("head -c 4000000 /dev/zero | tr '\\0' a > /app/big.txt")
        bomb = await http.post(
            "/edit_file",
            json={"path": "/app/big.txt", "old": "a", "new": "x" * 2000, "count": 4000000},
            headers=headers,
        )
        assert bomb.status_code == 400 and "over" in bomb.text, bomb.text
        fixed = await http.post(
            "/edit_file",
            json={"path": "/app/calc.py", "old": "(len(values) - 1)", "new": "len(values)"},
            headers=headers,
        )
        assert fixed.status_code == 200, fixed.text
        wrote = await http.post(
            "/write_file", json={"path": "/app/new/dir/notes.txt", "content": "x"},
            headers=headers,
        )  # fmt: skip
        assert wrote.json()["bytes"] == 1
        missing = await http.post("/read_file", json={"path": "/nope"}, headers=headers)
        assert missing.status_code == 400

        verified = await http.post(
            "/verify", json={**row("fix-failing-test"), "response": {"output": []}}, headers=headers
        )
        body = verified.json()
        assert body["reward"] == 1.0 and body["integrity_suspect"] == 0.0, body
        assert body["harbor_reward_file"] == "/logs/verifier/reward.txt"
        again = await http.post("/run_command", json={"command": "true"}, headers=headers)
        assert again.status_code == 404  # the session (and its container) is gone


async def test_a_row_naming_no_task_is_refused(env: str) -> None:
    async with httpx.AsyncClient(base_url=env, timeout=60) as http:
        answer = await http.post(
            "/seed_session", json=row("hello-file") | {"harbor": {"task": "../x"}}
        )
        assert answer.status_code == 422 and "names no task" in answer.text


async def test_the_tool_agent_is_the_terminal_agent(env: str) -> None:
    def policy(kind: str) -> RetryPolicy:
        return RetryPolicy.model_validate(kind_defaults(kind))  # type: ignore[arg-type]

    script = [
        {"call": "run_command", "arguments": {"command": "cat /app/hello.txt; ls /tests"}},
        {"call": "write_file", "arguments": {"path": "/app/hello.txt",
                                              "content": "Hello, rollgym!\n"}},
        {"say": "Done."},
    ]  # fmt: skip
    async with serve_server("scripted", name="model") as (model, _):
        peers = {
            "model": Target.single("model", model, policy("model")),
            "tasks": Target.single("tasks", env, policy("resources")),
        }
        options = {"model": "model", "resources": "tasks", "tools_from_server": True}
        async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
            agent,
            _,
        ):
            task = row("hello-file", metadata={"rollgym_script": script})
            async with httpx.AsyncClient(timeout=180) as http:
                answer = await http.post(f"{agent}/run", json=task)
    body = answer.json()
    assert answer.status_code == 200, body
    assert body["reward"] == 1.0, body
    outputs = [i for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert len(outputs) == 2
    assert "No such file" in outputs[0]["output"]  # the first command saw no file, no /tests


def _failing_tasks(root: Path) -> Path:
    """Two tasks whose verifier leaves no reward that can be read."""
    for name, toml, test in (
        ("bad-reward", "", "echo 'one' > /logs/verifier/reward.txt\n"),
        ("slow-verifier", "[verifier]\ntimeout_sec = 2\n",
         "echo 1 > /logs/verifier/reward.txt; sleep 60\n"),
    ):  # fmt: skip
        shutil.copytree(BUNDLED / "hello-file", root / name)
        (root / name / "task.toml").write_text(toml)
        (root / name / "tests" / "test.sh").write_text(
            "#!/bin/bash\nmkdir -p /logs/verifier\n" + test
        )
    return root


async def test_an_unreadable_reward_is_a_typed_failure_a_late_one_a_flagged_zero(
    tmp_path: Path,
) -> None:
    # A test.sh past its timeout pays 0 flagged, whatever it wrote first (its usual cause is
    # the agent's code the tests run: a failure would drop the rollout, so hanging would beat
    # a wrong answer); a reward file that names no number stays a verifier_error.
    tasks = _failing_tasks(tmp_path / "tasks")
    options = {"tasks_dir": str(tasks)}
    async with (
        serve_server("harbor", name="tasks", options=options) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=120) as http,
    ):
        answers = {}
        for task in ("bad-reward", "slow-verifier"):
            seeded = (await http.post("/seed_session", json=row_of(tasks, task))).json()
            answers[task] = await http.post(
                "/verify", json={**row_of(tasks, task), "response": {"output": []}},
                headers={SESSION_HEADER: seeded["session_id"]},
            )  # fmt: skip
    bad = answers["bad-reward"]
    assert bad.status_code >= 500, bad.text
    error = bad.json()["error"]
    assert error["type"] == "verifier_error" and "no number" in error["message"], error
    late = answers["slow-verifier"]
    assert late.status_code == 200, late.text
    body = late.json()
    assert body["reward"] == 0.0 and body["harbor_verify_broken"] == 1.0, body
    assert "did not finish" in body["harbor_verify_broken_reason"], body


def row_of(tasks: Path, task: str) -> dict[str, Any]:
    instruction = (tasks / task / "instruction.md").read_text()
    return {"responses_create_params": {"input": instruction}, "harbor": {"task": task}}
