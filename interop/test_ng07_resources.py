"""A rollgym resources server held to NeMo Gym 0.7's session contract by 0.7's own code.

Opt in with ``INTEROP07_VENV=/path/to/the/0.7/venv`` (``.interop07-venv``). rollgym's ``lookup``
environment is served for real on 127.0.0.1; ``interop/ng07_resources_probe.py`` runs in 0.7's
Python against its URL: 0.7's ``check_resources_session_contract`` (seed, repeated seed, close,
repeated close, close of a never-seeded id, late seeds refused), then the resources half of
``single_agent_turn``'s sequence with 0.7's client and models (seed with a cookie, a granted tool
call, verify at a ``/ng-rollout/<id>`` URL, close, ``GET /reverify_mode``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollgym.envs.lookup.server import LookupEnv
from rollgym.testing import serve_server
from tests.support.background import in_thread

VENV = os.environ.get("INTEROP07_VENV")
PROBE = Path(__file__).with_name("ng07_resources_probe.py")

pytestmark = [
    pytest.mark.skipif(not VENV, reason="opt-in: set INTEROP07_VENV to NeMo Gym 0.7's venv"),
    pytest.mark.timeout(600),
]


def probe(url: str) -> dict[str, object]:
    """The probe's findings at ``url``, run by 0.7's Python."""
    assert VENV is not None
    python = Path(VENV) / "bin" / "python"
    done = subprocess.run(
        [str(python), str(PROBE), url], capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the probe printed no result (rc {done.returncode}):\n{done.stderr[-3000:]}"
    found: dict[str, object] = json.loads(lines[-1])
    return found


def test_lookup_keeps_0_7s_session_contract_and_sequence() -> None:
    with in_thread(serve_server("lookup", name="lookup")) as (url, _):
        found = probe(url)
    assert found["conformance"] == "ok"
    sequence = found["sequence"]
    assert isinstance(sequence, dict)
    assert "error" not in sequence, sequence
    assert sequence["seed_cookies"] == ["rollgym_session"]
    assert sequence["seed_echoes_id"] is True and sequence["close_echoes_id"] is True
    assert sequence["tool_status"] == 200
    assert sequence["verify_url"] == f"{url}/ng-rollout/0-0/verify"
    assert (sequence["reward"], sequence["tool_called"]) == (1.0, 1)
    assert sequence["tool_after_close_status"] == 404  # its state went with the close
    assert sequence["reverify_mode"] == LookupEnv.reverify_mode
