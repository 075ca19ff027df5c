"""Run by NeMo Gym 0.7's own Python (never rollgym's): hold a resources server at a URL to 0.7's
session contract, with 0.7's own code.

    python interop/ng07_resources_probe.py URL

1. ``nemo_gym.testing.session_conformance.check_resources_session_contract``, 0.7's checker. It
   drives an ASGI app through Starlette's ``TestClient``; here that app forwards every request
   to URL (method, path, body, cookies, and the answer's status, headers and body back), so
   the checker runs against the server at URL as it would against an app in process.
2. The resources half of ``single_agent_turn``'s sequence, with 0.7's client
   (``nemo_gym.server_utils.request``, ``raise_for_status``, ``get_response_json``), its wire
   models and its own cookie reading: seed (0.7's body; a cookie must be set), a tool call with
   the granted cookies (as ``simple_agent`` calls a ``direct_http`` grant), verify
   (``task_data | {responses_create_params, response}``, at a ``/ng-rollout/<id>`` URL built by
   0.7's ``apply_rollout_prefix``) parsed as ``SingleAgentTurnResult``, close, and a tool call
   after the close; then ``GET /reverify_mode`` parsed as ``ReverifyMode``.

Prints one JSON object: ``{"conformance": "ok" | <what failed>, "sequence": {...}}``.
It ends with ``os._exit``: 0.7's Python 3.13.0 has segfaulted at interpreter exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from uuid import uuid4

LOOKUP_TASK = {"expected_answer": "48,213"}
PARAMS = {"input": [{"role": "user", "content": "How many people live in Brackenholt?"}]}


def forwarding_app(base: str) -> Any:
    """An ASGI app answering every request with what the server at ``base`` answers."""
    import aiohttp
    import yarl

    dropped = {b"host", b"content-length", b"connection", b"transfer-encoding"}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [
            (k.decode(), v.decode()) for k, v in scope["headers"] if k.lower() not in dropped
        ]
        url = yarl.URL(base + scope["raw_path"].decode(), encoded=True)
        jar = aiohttp.DummyCookieJar()  # the TestClient keeps the cookies, not this hop
        async with (
            aiohttp.ClientSession(cookie_jar=jar) as http,
            http.request(scope["method"], url, data=body or None, headers=headers) as answer,
        ):
            content = await answer.read()
            out = [
                (k.lower().encode(), v.encode())
                for k, v in answer.headers.items()
                if k.lower().encode() not in dropped and k.lower() != "content-encoding"
            ]
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        await send({"type": "http.response.body", "body": content})

    return app


def conformance(base: str) -> str:
    from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
    from nemo_gym.testing.session_conformance import check_resources_session_contract

    seed = ResourcesSeedSessionRequest.model_validate(
        {
            "resources_session_id": f"resources-session-{uuid4().hex}",
            "episode_id": {"rollout_id": "0-0", "attempt": 0},
            "task_id": {"taskset": "lookup:example", "task_id": "t0"},
            "task_data": LOOKUP_TASK,
        }
    )
    try:
        check_resources_session_contract(forwarding_app(base), seed, keeps_state=True)
    except Exception as exc:  # an AssertionError, or an answer its models refuse
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def reply(text: str) -> dict[str, Any]:
    from nemo_gym.openai_utils import NeMoGymResponse

    response = {
        "id": "resp_probe",
        "object": "response",
        "created_at": 0,
        "model": "probe",
        "status": "completed",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "message",
                "id": "msg_probe",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }
    return NeMoGymResponse.model_validate(response).model_dump(mode="json")


async def sequence(base: str) -> dict[str, Any]:
    from environment_servers.single_agent_turn.app import _cookies
    from nemo_gym.base_resources_server import (
        ResourcesCloseSessionRequest,
        ResourcesCloseSessionResponse,
        ResourcesSeedSessionRequest,
        ResourcesSeedSessionResponse,
        ReverifyMode,
    )
    from nemo_gym.episode_types import EpisodeId, TaskId
    from nemo_gym.server_utils import (
        GlobalAIOHTTPAsyncClientConfig,
        apply_rollout_prefix,
        get_response_json,
        raise_for_status,
        request,
        set_global_aiohttp_client,
    )
    from nemo_gym.single_agent_turn_types import SingleAgentTurnResult

    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    out: dict[str, Any] = {}
    name = f"resources-session-{uuid4().hex}"
    episode = EpisodeId(rollout_id="0-0", attempt=0)
    seed_body = ResourcesSeedSessionRequest(
        resources_session_id=name,
        episode_id=episode,
        task_id=TaskId(taskset="lookup:example", task_id="t0"),
        task_data=LOOKUP_TASK,
    ).model_dump(mode="json")
    seeded = await request("POST", f"{base}/seed_session", json=seed_body)
    await raise_for_status(seeded)
    cookies = _cookies(seeded)
    out["seed_cookies"] = sorted(cookies)
    answer = ResourcesSeedSessionResponse.model_validate(await get_response_json(seeded))
    out["seed_echoes_id"] = answer.resources_session_id == name

    tool = await request("POST", f"{base}/lookup", json={"key": "Brackenholt"}, cookies=cookies)
    out["tool_status"] = tool.status
    out["tool_output"] = json.loads((await tool.content.read()).decode())

    verify_url = apply_rollout_prefix(base, episode.rollout_id) + "/verify"
    out["verify_url"] = verify_url
    body = LOOKUP_TASK | {"responses_create_params": PARAMS, "response": reply("About 48,213.")}
    verified = await request("POST", verify_url, json=body, cookies=cookies)
    await raise_for_status(verified)
    result = SingleAgentTurnResult.model_validate(await get_response_json(verified))
    out["reward"] = result.reward
    out["tool_called"] = (result.model_extra or {}).get("tool_called")

    close_body = ResourcesCloseSessionRequest(resources_session_id=name, episode_id=episode)
    closed = await request(
        "POST", f"{base}/close_session", json=close_body.model_dump(mode="json"), cookies=cookies
    )
    await raise_for_status(closed)
    closed_answer = ResourcesCloseSessionResponse.model_validate(await get_response_json(closed))
    out["close_echoes_id"] = closed_answer.resources_session_id == name
    late = await request("POST", f"{base}/lookup", json={"key": "Brackenholt"}, cookies=cookies)
    out["tool_after_close_status"] = late.status

    mode = await request("GET", f"{base}/reverify_mode")
    await raise_for_status(mode)
    out["reverify_mode"] = ReverifyMode(await get_response_json(mode)).value
    return out


def main() -> None:
    base = sys.argv[1].rstrip("/")
    result: dict[str, Any] = {"conformance": conformance(base)}
    try:
        result["sequence"] = asyncio.run(sequence(base))
    except Exception as exc:  # reported, for the test to show
        result["sequence"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
