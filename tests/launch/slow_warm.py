"""A resources server whose scoring pool warms up slowly (or fails to), for the launcher's
warm-up tests: each worker's ``warm_up()`` sleeps ``ROLLGYM_TEST_WARM_S`` seconds, or raises
when it is ``fail``. The server itself answers ``/health`` at once (``starting`` meanwhile)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rollgym.server.resources import ResourcesServer, Session

WARM_VAR = "ROLLGYM_TEST_WARM_S"


def warm_up() -> None:
    said = os.environ.get(WARM_VAR, "0")
    if said == "fail":
        raise RuntimeError("the scoring tables are missing")
    time.sleep(float(said))


def score(text: str) -> float:
    return float(text == "ok")


class SlowWarmUp(ResourcesServer):
    cpu_verify_workers = 1

    def cpu_work(self) -> Callable[..., Any]:
        return score

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        return float(await self.run_cpu(score, "ok"))
