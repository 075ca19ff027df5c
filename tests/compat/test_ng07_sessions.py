"""NeMo Gym 0.7's session endpoints on rollgym's resources servers (and Gymnasium-style ones),
each test in-process (an ASGI call) and over a real socket:

- ``/seed_session`` with 0.7's body ``{resources_session_id, episode_id, task_id, task_data}``:
  seeded from ``task_data`` by the server's hook, answered ``{resources_session_id,
  resources_tools: null, sandbox_access: null}`` with a session cookie; idempotent per name and
  episode, 409 for another episode or a closed name, 422 naming the field of a malformed one;
- ``/verify`` and tools with that cookie see that session, and only that one;
- ``/close_session`` releases it (then the cookie names an unknown session: 404); unknown or
  closed names answer 200, a missing field 422;
- ``GET /reverify_mode``: the class's mode.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from rollgym.config import ServerLimits
from rollgym.envs.lookup.server import LookupEnv
from rollgym.nemo_gym.resources_sessions import MAX_NAME_CHARS, SeedRequest
from rollgym.protocol import Reset, Step
from rollgym.server.gymnasium import GymnasiumServer
from rollgym.server.resources import ResourcesServer, Session, tool
from rollgym.server.sessions import SessionStore
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER
from tests.envs.env_client import reply
from tests.support.asgi import TRANSPORTS, Client, build, client

pytestmark = pytest.mark.timeout(60)

PARAMS = {"input": "How many people live in Brackenholt?"}
EPISODE = {"rollout_id": "0-0", "attempt": 0}
TASK_ID = {"taskset": "counter:test", "task_id": "t0"}


class Counter(ResourcesServer):
    """Counts ``bump`` calls in its session; pays 1 when the count is the row's ``expected``.
    Its seed hook records what it was seeded with, and waits while ``gate`` is clear."""

    row_fields = frozenset({"expected", "start"})
    reverify_mode: ClassVar[Any] = "unsupported"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seeded: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def seed_session(self, session: Session) -> None:
        self.seeded.append(session.task)
        self.waiting.set()
        await self.gate.wait()
        session.data["n"] = int(session.task.get("start", 0))

    @tool
    async def bump(self, session: Session) -> dict[str, Any]:
        """Add one to the session's count."""
        session.data["n"] = session.data.get("n", 0) + 1
        return {"n": session.data["n"]}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        n = session.data.get("n", 0)
        return {"reward": float(n == task["expected"]), "count": n}


def seed_body(name: str = "resources-session-1", **fields: Any) -> dict[str, Any]:
    body = {
        "resources_session_id": name,
        "episode_id": EPISODE,
        "task_id": TASK_ID,
        "task_data": {"expected": 2, "start": 0},
    }
    return {**body, **fields}


def verify_body(expected: int = 2) -> dict[str, Any]:
    """What single_agent_turn sends: task_data | {responses_create_params, response}."""
    return {
        "expected": expected,
        "start": 0,
        "responses_create_params": PARAMS,
        "response": reply("done"),
    }


def close_body(name: str = "resources-session-1", **fields: Any) -> dict[str, Any]:
    return {"resources_session_id": name, "episode_id": EPISODE, **fields}


@pytest.fixture(params=TRANSPORTS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    async with client(request.param, build(Counter)) as c:
        yield c


def message(answer: Any) -> str:
    return str(answer.body["error"]["message"])


# -- seed ------------------------------------------------------------------------------------


async def test_a_07_seed_opens_a_session_for_its_task_data_with_a_cookie(env: Client) -> None:
    seeded = await env.post("/seed_session", seed_body())
    assert seeded.status == 200
    assert seeded.body == {
        "resources_session_id": "resources-session-1",
        "resources_tools": None,
        "sandbox_access": None,
    }
    # The cookie 0.7's single_agent_turn insists on: rollgym's own random id, not the name.
    cookie = seeded.cookies[SESSION_COOKIE]
    assert len(cookie) == 32 and int(cookie, 16) >= 0
    assert env.server.seeded == [{"expected": 2, "start": 0}]  # task_data, as a row seeds it
    # Tools and verify with the cookie run in that session.
    for n in (1, 2):
        bumped = await env.post("/bump", {}, cookies=seeded.cookies)
        assert (bumped.status, bumped.body) == (200, {"n": n})
        assert bumped.cookies == seeded.cookies  # set again on every answer
    verified = await env.post("/verify", verify_body(), cookies=seeded.cookies)
    assert verified.status == 200
    assert (verified.body["reward"], verified.body["count"]) == (1.0, 2)
    assert verified.body["responses_create_params"] == PARAMS  # the flat 0.4 verify answer


async def test_a_repeated_seed_answers_the_same_session_and_seeds_once(env: Client) -> None:
    first = await env.post("/seed_session", seed_body())
    await env.post("/bump", {}, cookies=first.cookies)
    again = await env.post("/seed_session", seed_body())
    assert (again.status, again.body) == (200, first.body)
    assert again.cookies == first.cookies
    assert len(env.server.seeded) == 1
    # The session was not seeded afresh: its count goes on.
    bumped = await env.post("/bump", {}, cookies=again.cookies)
    assert bumped.body == {"n": 2}


async def test_a_name_belongs_to_one_episode_and_one_task(env: Client) -> None:
    first = await env.post("/seed_session", seed_body())
    other_episode = seed_body(episode_id={"rollout_id": "0-1", "attempt": 0})
    other_attempt = seed_body(episode_id={"rollout_id": "0-0", "attempt": 1})
    other_task = seed_body(task_id={"taskset": "counter:test", "task_id": "t9"})
    for body in (other_episode, other_attempt, other_task):
        refused = await env.post("/seed_session", body)
        assert refused.status == 409, refused.body
        assert "resources-session-1" in message(refused)
        assert SESSION_COOKIE not in refused.cookies  # no session handed out
    assert len(env.server.seeded) == 1
    # The first episode's session is untouched.
    bumped = await env.post("/bump", {}, cookies=first.cookies)
    assert bumped.body == {"n": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in seed_body().items() if k != "task_data"}, "task_data"),
        ({k: v for k, v in seed_body().items() if k != "resources_session_id"}, "resources_session_id"),
        (seed_body(episode_id={"rollout_id": "0-0-a1", "attempt": 0}), "episode_id.rollout_id"),
        (seed_body(episode_id={"rollout_id": "../x", "attempt": 0}), "episode_id.rollout_id"),
        (seed_body(episode_id={"rollout_id": "0-0", "attempt": -1}), "episode_id.attempt"),
        (seed_body(task_id={"taskset": "x"}), "task_id.task_id"),
        (seed_body(task_data=["not", "an", "object"]), "task_data"),
        (seed_body(resources_session_id=""), "resources_session_id"),
        (seed_body(resources_session_id=7), "resources_session_id"),
        (seed_body(resources_session_id="x" * (MAX_NAME_CHARS + 1)), "resources_session_id"),
        (seed_body(extra_field=1), "extra_field"),
        # No responses_create_params, but 0.7's fields: 0.7's body, not a task row.
        ({"episode_id": EPISODE, "expected": 2}, "resources_session_id"),
        ({"task_data": {"expected": 2}}, "resources_session_id"),
    ],
    ids=[
        "no-task_data", "no-name", "attempt-suffix", "dotted-id", "negative-attempt",
        "no-task-id", "task_data-list", "empty-name", "name-not-str", "huge-name", "extra-key",
        "episode-only", "task_data-only",
    ],
)  # fmt: skip
async def test_a_malformed_07_seed_is_a_422_naming_the_field(
    env: Client, body: dict[str, Any], field: str
) -> None:
    # 0.7 itself takes such a body for a task row (200 {}): rollgym refuses it instead.
    refused = await env.post("/seed_session", body)
    assert refused.status == 422, refused.body
    assert f"{field}:" in message(refused)
    assert len(message(refused)) < 2000  # a huge name is not echoed back
    assert env.server.seeded == []


async def test_a_task_row_still_seeds_as_before_even_with_a_task_id_field(env: Client) -> None:
    row = {"responses_create_params": PARAMS, "expected": 1, "task_id": "abc", "episode_id": "e"}
    seeded = await env.post("/seed_session", row)
    assert seeded.status == 200 and set(seeded.body) == {"session_id"}
    assert seeded.cookies[SESSION_COOKIE] == seeded.body["session_id"]
    await env.post("/bump", {}, cookies=seeded.cookies)
    verified = await env.post("/verify", {**row, "response": reply("x")}, cookies=seeded.cookies)
    assert verified.body["reward"] == 1.0
    # A task row's session ends with its verify, as it always has.
    again = await env.post("/bump", {}, cookies=seeded.cookies)
    assert again.status == 404


async def test_a_hostile_name_is_only_a_name(env: Client) -> None:
    hostile = "a; Path=/; rollgym_session=evil\r\nSet-Cookie: x=1 \u2028\U0001f600 ../../etc"
    seeded = await env.post("/seed_session", seed_body(hostile))
    assert seeded.status == 200
    assert seeded.body["resources_session_id"] == hostile
    assert len(seeded.set_cookie) == 1  # one cookie, rollgym's: the name went into no header
    assert set(seeded.cookies) == {SESSION_COOKIE}
    assert int(seeded.cookies[SESSION_COOKIE], 16) >= 0
    closed = await env.post("/close_session", close_body(hostile))
    assert (closed.status, closed.body) == (200, {"resources_session_id": hostile})
    refused = await env.post("/seed_session", seed_body(hostile))
    assert refused.status == 409


async def test_the_longest_name_taken_is_held_and_closed(env: Client) -> None:
    longest = "n" * MAX_NAME_CHARS
    seeded = await env.post("/seed_session", seed_body(longest))
    assert seeded.status == 200
    closed = await env.post("/close_session", close_body(longest))
    assert closed.status == 200
    refused = await env.post("/seed_session", seed_body(longest))
    assert refused.status == 409 and len(message(refused)) < 1000


# -- sessions never meet ----------------------------------------------------------------------


async def test_a_cookie_reaches_its_own_session_only(env: Client) -> None:
    a = await env.post("/seed_session", seed_body("rs-a"))
    b = await env.post(
        "/seed_session", seed_body("rs-b", episode_id={"rollout_id": "1-0", "attempt": 0})
    )
    assert a.cookies[SESSION_COOKIE] != b.cookies[SESSION_COOKIE]
    for _ in range(2):
        await env.post("/bump", {}, cookies=a.cookies)
    verified_b = await env.post("/verify", verify_body(), cookies=b.cookies)
    verified_a = await env.post("/verify", verify_body(), cookies=a.cookies)
    assert verified_b.body["count"] == 0 and verified_b.body["reward"] == 0.0
    assert verified_a.body["count"] == 2 and verified_a.body["reward"] == 1.0
    # Closing B (with A's cookie, even) leaves A alone.
    closed = await env.post(
        "/close_session", close_body("rs-b", episode_id={"rollout_id": "1-0"}), cookies=a.cookies
    )
    assert closed.status == 200
    assert (await env.post("/bump", {}, cookies=a.cookies)).body == {"n": 3}
    assert (await env.post("/bump", {}, cookies=b.cookies)).status == 404
    # A made-up cookie names no session.
    forged = {SESSION_COOKIE: "0" * 32}
    assert (await env.post("/bump", {}, cookies=forged)).status == 404
    # The header names a session as the cookie does.
    sid = a.cookies[SESSION_COOKIE]
    assert (await env.post("/bump", {}, headers={SESSION_HEADER: sid})).body == {"n": 4}


async def test_a_named_session_outlives_its_verify_until_it_is_closed(env: Client) -> None:
    seeded = await env.post("/seed_session", seed_body())
    await env.post("/bump", {}, cookies=seeded.cookies)
    await env.post("/bump", {}, cookies=seeded.cookies)
    first = await env.post("/verify", verify_body(), cookies=seeded.cookies)
    again = await env.post("/verify", verify_body(), cookies=seeded.cookies)  # a retried verify
    assert first.body["reward"] == again.body["reward"] == 1.0


# -- close -----------------------------------------------------------------------------------


async def test_close_releases_the_session_and_blocks_its_name(env: Client) -> None:
    seeded = await env.post("/seed_session", seed_body())
    for attempt in ("close", "repeated close"):
        closed = await env.post("/close_session", close_body(), cookies=seeded.cookies)
        assert (closed.status, closed.body) == (
            200,
            {"resources_session_id": "resources-session-1"},
        ), attempt
    # The state is gone: the cookie names an unknown session, as any unknown one.
    for path, body in (("/bump", {}), ("/verify", verify_body())):
        gone = await env.post(path, body, cookies=seeded.cookies)
        assert gone.status == 404, path
        assert "unknown session" in message(gone)
    late = await env.post("/seed_session", seed_body())
    assert late.status == 409 and "closed" in message(late)
    assert len(env.server.seeded) == 1


async def test_closing_an_unknown_name_answers_200_and_blocks_a_late_seed(env: Client) -> None:
    closed = await env.post("/close_session", close_body("never-seeded"))
    assert (closed.status, closed.body) == (200, {"resources_session_id": "never-seeded"})
    late = await env.post("/seed_session", seed_body("never-seeded"))
    assert late.status == 409
    assert env.server.seeded == []


@pytest.mark.parametrize(
    "body",
    [
        {"episode_id": EPISODE},
        {"resources_session_id": "resources-session-1"},
        {"resources_session_id": "resources-session-1", "episode_id": {"attempt": 0}},
        close_body(extra=1),
        None,
        ["resources-session-1"],
    ],
    ids=["no-name", "no-episode", "no-rollout-id", "extra-key", "no-body", "a-list"],
)
async def test_a_malformed_close_is_a_422_and_closes_nothing(env: Client, body: Any) -> None:
    seeded = await env.post("/seed_session", seed_body())
    refused = await env.post("/close_session", body, cookies=seeded.cookies)
    assert refused.status == 422, refused.body
    assert (await env.post("/bump", {}, cookies=seeded.cookies)).status == 200


async def test_closing_another_episodes_session_is_refused(env: Client) -> None:
    seeded = await env.post("/seed_session", seed_body())
    wrong = close_body(episode_id={"rollout_id": "9-9", "attempt": 0})
    refused = await env.post("/close_session", wrong)
    assert refused.status == 409
    assert (await env.post("/bump", {}, cookies=seeded.cookies)).status == 200


async def test_close_ends_a_task_rows_session_named_by_the_call(env: Client) -> None:
    row = {"responses_create_params": PARAMS, "expected": 1}
    seeded = await env.post("/seed_session", row)
    closed = await env.post("/close_session", close_body("whatever"), cookies=seeded.cookies)
    assert closed.status == 200
    assert (await env.post("/bump", {}, cookies=seeded.cookies)).status == 404


# -- races -----------------------------------------------------------------------------------


async def test_a_seed_racing_the_first_waits_for_it_and_seeds_nothing(env: Client) -> None:
    env.server.gate.clear()
    first = asyncio.create_task(env.post("/seed_session", seed_body()))
    await asyncio.wait_for(env.server.waiting.wait(), 20)
    second = asyncio.create_task(env.post("/seed_session", seed_body()))
    other = await env.post(
        "/seed_session", seed_body(episode_id={"rollout_id": "5-5", "attempt": 0})
    )
    assert other.status == 409  # refused at once, the first seed still running
    assert not second.done()
    env.server.gate.set()
    a, b = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert a.status == b.status == 200
    assert a.cookies == b.cookies
    assert len(env.server.seeded) == 1


async def test_a_close_during_the_seed_wins(env: Client) -> None:
    env.server.gate.clear()
    seeding = asyncio.create_task(env.post("/seed_session", seed_body()))
    await asyncio.wait_for(env.server.waiting.wait(), 20)
    closed = await env.post("/close_session", close_body())
    assert closed.status == 200
    env.server.gate.set()
    refused = await asyncio.wait_for(seeding, 20)
    assert refused.status == 409 and SESSION_COOKIE not in refused.cookies
    assert (await env.post("/seed_session", seed_body())).status == 409


async def test_the_store_holds_a_racing_seed_until_the_first_is_prepared() -> None:
    """The same race on the store alone, where nothing but the event loop runs: the second
    seed does not answer before the first seed's hook has finished."""
    store = SessionStore("env", ServerLimits())
    gate = asyncio.Event()
    prepared: list[str] = []

    async def prepare(session: Session) -> None:
        await gate.wait()
        prepared.append(session.id)

    request = SeedRequest.model_validate(seed_body())
    name, data = request.session_name, request.task_data
    first = asyncio.create_task(store.seed_named(name, data, 10, prepare))
    second = asyncio.create_task(store.seed_named(name, data, 10, prepare))
    for _ in range(20):  # every ready task runs to its next wait
        await asyncio.sleep(0)
    assert not first.done() and not second.done()
    second.cancel()  # a waiter that goes away does not cancel the first seed
    third = asyncio.create_task(store.seed_named(name, data, 10, prepare))
    gate.set()
    a, c = await asyncio.gather(first, third)
    assert a is c and prepared == [a.id] and len(store) == 1


# -- reverify_mode ---------------------------------------------------------------------------


async def test_reverify_mode_is_the_class_attribute(env: Client) -> None:
    answer = await env.get("/reverify_mode")
    assert (answer.status, answer.body) == (200, "unsupported")
    assert (await env.post("/reverify_mode", {})).status == 405  # GET, as in 0.7


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reverify_mode_is_unknown_unless_the_environment_says(transport: str) -> None:
    async with client(transport, build(LookupEnv, "lookup")) as c:
        expected = type(c.server).reverify_mode
        answer = await c.get("/reverify_mode")
    assert (answer.status, answer.body) == (200, expected)
    assert ResourcesServer.reverify_mode == "unknown"


BUNDLED_MODES = {
    "rollgym.envs.code.server:CodeEnv": "stateless",
    "rollgym.envs.echo.server:EchoEnv": "stateless",
    "rollgym.envs.judge.server:JudgeEnv": "stateless",
    "rollgym.envs.math.server:MathEnv": "stateless",
    "rollgym.envs.mcqa.server:MCQAEnv": "stateless",
    "rollgym.envs.lookup.server:LookupEnv": "unsupported",
    "rollgym.envs.guess.server:GuessEnv": "unsupported",
}


@pytest.mark.parametrize(("where", "mode"), sorted(BUNDLED_MODES.items()))
def test_every_bundled_environment_says_whether_verify_alone_rescores_it(
    where: str, mode: str
) -> None:
    # 0.7's ``gym eval reverify`` posts /verify alone and refuses "unknown" and "unsupported"
    # servers; lookup and guess pay for what their sessions saw, so /verify alone cannot.
    module, name = where.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert cls.reverify_mode == mode


async def test_a_bundled_environment_answers_its_mode_over_http() -> None:
    from rollgym.envs.math.server import MathEnv

    async with client("socket", build(MathEnv, "math")) as c:
        answer = await c.get("/reverify_mode")
    assert (answer.status, answer.body) == (200, "stateless")


def test_a_reverify_mode_outside_0_7s_three_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match="reverify_mode 'sometimes'"):

        class Vague(ResourcesServer):
            reverify_mode: ClassVar[Any] = "sometimes"


# -- the whole 0.7 sequence on a bundled environment -------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_single_agent_turns_sequence_on_lookup(transport: str) -> None:
    """seed (0.7 body) -> tool with the seed's cookies -> verify (task_data | rcp | response)
    with the latest cookies -> close, as 0.7's single_agent_turn and a session agent do."""
    task_data = {"expected_answer": "48,213"}
    async with client(transport, build(LookupEnv, "lookup")) as c:
        rewards = []
        for i, looks_up in enumerate((True, False)):
            name = f"resources-session-{i}"
            episode = {"rollout_id": f"{i}-0", "attempt": 0}
            seeded = await c.post(
                "/seed_session",
                {"resources_session_id": name, "episode_id": episode,
                 "task_id": {"taskset": "lookup:example", "task_id": f"t{i}"},
                 "task_data": task_data},
            )  # fmt: skip
            assert seeded.status == 200 and seeded.cookies
            cookies = seeded.cookies
            if looks_up:
                looked = await c.post("/lookup", {"key": "Brackenholt"}, cookies=cookies)
                assert looked.status == 200
                cookies = looked.cookies or cookies
            body = {**task_data, "responses_create_params": PARAMS, "response": reply("48,213")}
            verified = await c.post("/verify", body, cookies=cookies)
            assert verified.status == 200, verified.body
            rewards.append((verified.body["reward"], verified.body["tool_called"]))
            close = {"resources_session_id": name, "episode_id": episode}
            closed = await c.post("/close_session", close, cookies=cookies)
            assert (closed.status, closed.body) == (200, {"resources_session_id": name})
            assert (await c.post("/lookup", {"key": "x"}, cookies=cookies)).status == 404
    assert rewards == [(1.0, 1), (0.0, 0)]


# -- Gymnasium-style servers ------------------------------------------------------------------


class Steps(GymnasiumServer):
    async def reset(self, session: Session) -> Reset:
        session.data["steps"] = 0
        return Reset("go")

    async def step(self, session: Session, response: dict[str, Any]) -> Step:
        session.data["steps"] += 1
        done = session.data["steps"] == 3
        return Step(None if done else "again", 1.0 if done else 0.0, terminated=done)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_gymnasium_episode_ends_at_close_session(transport: str) -> None:
    row = {"responses_create_params": PARAMS}
    async with client(transport, build(Steps, "steps")) as c:
        a = await c.post("/reset", row)
        b = await c.post("/reset", row)
        step = {**row, "response": reply("x")}
        assert (await c.post("/step", step, cookies=a.cookies)).status == 200
        closed = await c.post("/close_session", close_body("gym-a"), cookies=a.cookies)
        assert (closed.status, closed.body) == (200, {"resources_session_id": "gym-a"})
        assert (await c.post("/step", step, cookies=a.cookies)).status == 404
        assert (await c.post("/step", step, cookies=b.cookies)).status == 200  # B goes on
        again = await c.post("/close_session", close_body("gym-a"))
        assert again.status == 200
        assert (await c.post("/close_session", {"episode_id": EPISODE})).status == 422
        mode = await c.get("/reverify_mode")
        assert (mode.status, mode.body) == (200, "unsupported")
        assert c.server.open_episodes == 1
