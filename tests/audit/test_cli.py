"""``rollgym audit`` as a command: a launched server and a foreign ``url:`` one in one config,
audit.json's shape, the exit codes, and usage errors that name the key or the file."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from rollgym.testing import serve_asgi
from tests.audit.planted import HARDENED, ROWS, foreign_app

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


async def rollgym(*args: str, cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollgym", *args, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    return proc.returncode or 0, out.decode()


async def test_audits_launched_and_foreign_servers_and_writes_audit_json(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    twin = next(f for f in HARDENED if f.name == "EmptySubstringHardened")
    async with serve_asgi(foreign_app(twin)) as url:
        (tmp_path / "config.yaml").write_text(
            "servers:\n"
            "  flawed: {kind: resources, impl: tests.audit.planted:EmptySubstring}\n"
            f"  foreign: {{kind: resources, url: '{url}'}}\n"
            "collect: {input: rows.jsonl}\n"
        )
        code, out = await rollgym("audit", "config.yaml", "--output", "out", cwd=tmp_path)
    assert code == 1, out
    report = json.loads((tmp_path / "out" / "audit.json").read_text())
    servers = report["servers"]
    assert set(servers) == {"flawed", "foreign"}
    assert servers["foreign"]["verdict"] == "clean"
    assert servers["flawed"]["verdict"] == "exploitable"
    finding = next(f for f in servers["flawed"]["findings"] if f["class"] == "empty_answer")
    assert {"probe", "rows_tried", "rows_paid", "mean_reward", "mean_floor", "example"} <= set(
        finding
    )
    assert finding["example"]["request"]["endpoint"] == "/verify"
    assert isinstance(servers["flawed"]["seconds"], float)
    assert "exploitable" in out and "empty_answer" in out


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("servers:\n  m: {kind: model, impl: scripted}\n", "no resources server"),
        ("servers:\n  e: {kind: resources, impl: echo}\n", "collect.input"),
        ("servers:\n  e: {kind: resources, impl: echo}\ncollect: {input: gone.jsonl}\n",
         "gone.jsonl"),
    ],
)  # fmt: skip
async def test_a_usage_error_exits_2_naming_the_key(tmp_path: Path, config: str, said: str) -> None:
    (tmp_path / "config.yaml").write_text(config)
    code, out = await rollgym("audit", "config.yaml", cwd=tmp_path)
    assert code == 2, out
    assert said in out


async def test_help_explains_the_classes_and_exit_codes(tmp_path: Path) -> None:
    code, out = await rollgym("audit", "--help", cwd=tmp_path)
    assert code == 0
    for word in ("verdict_injection", "tool_leak", "floor", "Exit 0", "--limit", "--input"):
        assert word in out, word
