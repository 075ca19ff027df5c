"""The mcqa and math reward-parity cases (tests/compat/parity) run against both live servers:
NeMo Gym's own ``mcqa`` and ``math_with_judge`` served by ``gym env start``, and rollgym's
``mcqa`` and ``math`` served by ``rollgym serve``.

Two checks: NeMo Gym's live servers answer every case as the fixture recorded (it was made in
process through fastapi's TestClient, so this shows the served app agrees), and rollgym's live
servers agree with them except for the documented differences that the parity test pins.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from interop.conftest import MCQA_MODES, Stacks
from interop.nemo import http_json
from tests.compat.parity import test_nemo_gym_parity as parity

pytestmark = pytest.mark.timeout(900)
MODE_SUFFIX = {mode: suffix for suffix, mode in MCQA_MODES.items()}


def server_name(case: dict[str, Any], side: str) -> str:
    if case["env"] == "math":
        return "math_with_judge" if side == "nemo" else "math"
    return "mcqa" + MODE_SUFFIX[case["server_options"].get("grading_mode")]


def verify(url: str, row: dict[str, Any], output: list[dict[str, Any]]) -> tuple[int, Any]:
    wrap = parity._script().response
    return http_json(url + "/verify", {**row, "response": wrap(output)}, timeout=120)


def outcome(status: int, body: Any) -> parity.Outcome:
    if status != 200:
        return parity.Outcome(None)
    return parity.Outcome(float(body["reward"]), body.get("extracted_answer"))


def run_cases(stacks: Stacks) -> list[tuple[dict[str, Any], tuple[int, Any], tuple[int, Any]]]:
    _, cases = parity.load()
    rows = json.loads(parity.FIXTURE.read_text().split("\n", 1)[0])["rows"]

    def both(case: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, Any], tuple[int, Any]]:
        theirs = (
            verify(stacks.nemo[server_name(case, "nemo")], rows[case["nemo_row"]], case["output"])
            if "nemo_row" in case
            else verify(stacks.nemo[server_name(case, "nemo")], case["row"], case["output"])
        )
        ours = verify(stacks.rollgym[server_name(case, "rollgym")], case["row"], case["output"])
        return case, theirs, ours

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(both, cases))


def test_parity_cases_against_both_live_servers(stacks: Stacks) -> None:
    header, _ = parity.load()
    docs = parity.differences(header)
    results = run_cases(stacks)
    stale_fixture, disagree = [], []
    for case, (n_status, n_body), (r_status, r_body) in results:
        recorded = case["nemo"]
        live = {"status": n_status}
        if n_status == 200:
            live |= {"reward": n_body["reward"]}
            if "extracted_answer" in recorded:
                live["extracted_answer"] = n_body.get("extracted_answer")
        if live != recorded:
            stale_fixture.append(f"{case['id']}: live {live}, recorded {recorded}")
        theirs, ours = outcome(n_status, n_body), outcome(r_status, r_body)
        assert r_status in (200, 422), (case["id"], r_status, r_body)
        if parity.documented(case["id"], docs) is None and not parity._agree(
            case["env"], ours, theirs
        ):
            disagree.append(f"{case['id']}: rollgym {ours.show()}, NeMo Gym {theirs.show()}")
    print(f"\nlive parity: {len(results)} cases, {len(disagree)} undocumented differences")
    assert not stale_fixture, "\n".join(stale_fixture[:40])
    assert not disagree, "\n".join(disagree[:40])
    assert json.dumps(header["versions"]["nemo-gym"]) == '"0.4.0"'
