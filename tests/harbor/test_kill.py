"""Issue 40 item 6 end to end: the collector of a Harbor run SIGKILLed at seeded random points
while its containers live; the next run's start leaves nothing of the killed run within 5 s
(containers, storage-only containers, snapshot and prepared images, found by their lease's
owner pid), and nothing past its deadline. 20 kills, and the 5 s figure: ``bench/harbor_kills.py``
(a timed bound here failed on a loaded machine, 5.26 s beside other tests; the test asserts that
the next start cleans everything, within ``kills.CLEAN_WAIT``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harbor.conftest import needs_podman
from tests.harbor.kills import CLEAN_WAIT, kill_cycles

KILLS = 3


@needs_podman
@pytest.mark.timeout(300)
def test_a_sigkilled_collector_leaves_nothing_after_the_next_start(tmp_path: Path) -> None:
    report = kill_cycles(tmp_path, KILLS, seed=40)
    assert len(report.cycles) == KILLS
    for i, cycle in enumerate(report.cycles):
        assert cycle.left_after_clean == 0, f"kill {i + 1}: {cycle}"
        assert cycle.past_deadline == 0, f"kill {i + 1}: {cycle}"
        assert cycle.clean_seconds is not None, (
            f"kill {i + 1}: not clean within {CLEAN_WAIT:g} s: {cycle}"
        )
