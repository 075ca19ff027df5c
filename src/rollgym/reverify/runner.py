"""How a recorded rollout is scored again: a ``Runner`` that replays it against the resources
server (``/seed_session``, its tool calls, ``/verify``), and the dispatcher that feeds it the
recorded successes and copies the source run's failures as they were."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from rollgym.agents.tool_agent import unsent_calls
from rollgym.collect.dispatch import DispatchReport, LocalDispatcher, Runner
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord, ScoredRollout
from rollgym.collect.rollout import RolloutPolicy
from rollgym.config import RetryPolicy
from rollgym.errors import InternalError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.protocol import check_verified, function_calls
from rollgym.reverify.source import RecordedRun
from rollgym.server.agent import TIMING_FIELD, Hops, TimedEpisode
from rollgym.server.episode import Episode, ResourcesClient


async def replay_tools(episode: Episode, row: dict[str, Any], response: dict[str, Any]) -> None:
    """Call again, in order, the tools the recorded rollout called: an environment that keeps
    per-session state (which lookups were made, a game's moves) verifies against that state, so
    a fresh session must be brought back to where the rollout left it. Only tools the row
    declares reach the server, as in the agent, and not the calls it left unsent past its caps;
    their outputs are not used (the recorded response is what is scored)."""
    declared = {
        str(t.get("name") or (t.get("function") or {}).get("name"))
        for t in (row.get("responses_create_params") or {}).get("tools") or []
        if isinstance(t, dict)
    }
    unsent = unsent_calls(response)
    for position, call in enumerate(function_calls(response)):
        name = str(call.get("name", ""))
        if (declared and name not in declared) or position in unsent:
            continue
        raw = call.get("arguments") or "{}"
        try:
            args = orjson.loads(raw) if isinstance(raw, str) else raw
        except orjson.JSONDecodeError:
            continue  # the agent answered it itself: nothing reached the environment
        # Sent past this episode's own budget: the agent took these calls from its rollout's
        # (whose max_tool_calls may be above the default) when it made them.
        await episode.send_tool(name, args)


@dataclass(slots=True)
class VerifyRunner:
    """A ``Runner`` that scores a recorded rollout: ``/seed_session`` with its task row (an
    environment that keeps state per session gets it back), then ``/verify`` with the row and the
    recorded response, on the ``resources`` target. Failures are typed as in any run."""

    http: HttpClient
    resources: Target
    source: RecordedRun
    policy: RolloutPolicy
    on_hold: Callable[[RollgymError], None] | None = None
    circuit_holds: int = 0
    failovers: int = 0

    async def run(self, item: RolloutItem) -> RolloutRecord:
        started = time.monotonic()
        attempts = item.prior_attempts + 1
        try:
            recorded = self.source.record((item.task_index, item.rollout_index))
            if recorded is None:  # the dispatcher sends only recorded successes
                raise InternalError(f"rollout {item.key} has no record", server="reverify")
            row = orjson.loads(item.row)
            hops = Hops()
            client = ResourcesClient(
                self.http, self.resources, tool_timeout=self.policy.timeout,
                verify_timeout=self.policy.timeout,
            )  # fmt: skip
            episode = TimedEpisode(client, item.key, hops)
            response = recorded.get("response") or {}
            await episode.seed(row)
            await replay_tools(episode, row, response)
            verified = check_verified(await episode.verify(row, response), self.resources.name)
            verified.setdefault(TIMING_FIELD, hops.to_dict())
        except RollgymError as err:
            return FailedRollout(
                item.task_index, item.rollout_index, err, attempts, time.monotonic() - started
            )
        return ScoredRollout(
            item.task_index, item.rollout_index, float(verified["reward"]), attempts,
            time.monotonic() - started, verified,
        )  # fmt: skip


class ReverifyDispatcher:
    """Local asyncio workers with a ``VerifyRunner``. Rollouts that failed in the source run
    are copied as they were, past the failure budget (they are not failures of this run);
    rollouts with no record there yet are left pending, and the run says so as it ends."""

    def __init__(
        self, source: RecordedRun, resources: str, retry: RetryPolicy, policy: RolloutPolicy,
        concurrency: int,
    ) -> None:  # fmt: skip
        self.source = source
        self.resources = resources
        self.retry = retry
        self.local = LocalDispatcher(policy, concurrency, runner=self._runner)
        self.copied = 0
        self.unrecorded = 0

    def _runner(
        self, http: HttpClient, agents: dict[str, Target], policy: RolloutPolicy,
        stopping: Callable[[], bool],
    ) -> Runner:  # fmt: skip
        # The launcher gave the agent's name the resources server's URLs (see ResourcesOnly);
        # they are called under the resources server's own retry policy.
        urls = next(iter(agents.values())).urls
        target = Target(self.resources, urls, self.retry)
        return VerifyRunner(http, target, self.source, policy)

    async def start(self, http: HttpClient, agents: dict[str, Target]) -> None:
        await self.local.start(http, agents)

    async def dispatch(self, work: Iterator[RolloutItem], pending: int, recorder: Recorder) -> None:
        await self.local.dispatch(self._verifiable(work, recorder), pending, recorder)
        if self.unrecorded and not recorder.aborted:
            recorder.abort(
                f"{self.unrecorded} rollouts have no record in {self.source.out_dir} yet (that "
                "run is unfinished); reverify them with --resume once it has them"
            )

    def _verifiable(self, work: Iterator[RolloutItem], recorder: Recorder) -> Iterator[RolloutItem]:
        for item in work:
            key = (item.task_index, item.rollout_index)
            if key in self.source.succeeded:
                yield item
            elif (failed := self.source.failed.get(key)) is not None:
                self._copy(recorder, failed)
            else:
                self.unrecorded += 1

    def _copy(self, recorder: Recorder, rec: dict[str, Any]) -> None:
        record = FailedRollout(
            rec["task_index"], rec["rollout_index"], RollgymError.from_dict(rec["error"]),
            int(rec.get("attempts", 1)), float(rec.get("duration_s", 0.0)),
        )  # fmt: skip
        # Straight to the sink: the source run's failures are no sign that this run's
        # verifier is broken, so the failure budget must not count them.
        if recorder.sink.add(record):
            recorder.recorded += 1
            self.copied += 1
            if recorder.progress is not None:
                recorder.progress.advance(failed=True)

    def cancel(self) -> None:
        self.local.cancel()

    @property
    def in_flight(self) -> int | None:
        return self.local.in_flight

    async def close(self) -> None:
        await self.local.close()

    async def report(self) -> DispatchReport:
        report = await self.local.report()
        report.sections["reverify"] = {
            "source": str(self.source.out_dir),
            "copied_failures": self.copied,
            "unrecorded": self.unrecorded,
        }
        return report
