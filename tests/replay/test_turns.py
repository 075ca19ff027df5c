"""The pure parts of replay: turns of a recorded output, the turn a request asks for, the first
divergence, and the environment comparison from run.json."""

from __future__ import annotations

from pathlib import Path

import orjson

from rollgym.replay.compare import first_divergence
from rollgym.replay.model import _Served
from rollgym.replay.plan import PlanEntry
from rollgym.replay.report import environment_change
from rollgym.replay.turns import model_turns, split_turns


def call(cid: str, name: str = "t", fid: str | None = None) -> dict[str, object]:
    return {"type": "function_call", "id": fid or f"fc_{cid}", "call_id": cid, "name": name,
            "arguments": "{}"}  # fmt: skip


def out(cid: str, text: str, fid: str = "fco_x") -> dict[str, object]:
    return {"type": "function_call_output", "id": fid, "call_id": cid, "output": text}


def say(text: str, mid: str = "msg_1") -> dict[str, object]:
    return {"type": "message", "id": mid, "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip


OUTPUT = [call("a"), call("b"), out("a", "1"), out("b", "2"), call("c"), out("c", "3"), say("x")]


def test_turns_are_runs_of_model_items_and_the_answers_after_them() -> None:
    prefix, turns = split_turns(OUTPUT)
    assert prefix == []
    assert [len(t.model) for t in turns] == [2, 1, 1]
    assert [[i["output"] for i in t.env] for t in turns] == [["1", "2"], ["3"], []]
    obs = {"type": "message", "role": "user", "content": "you see a door"}
    assert model_turns([obs, say("a"), obs, call("z"), out("z", "1")]) == 2


def test_the_turn_asked_for_is_read_from_the_items_it_carries() -> None:
    _, turns = split_turns(OUTPUT)
    served = _Served(PlanEntry("0:0", "3:1", [t.model for t in turns], prompt_turns=0))
    prompt = [{"role": "user", "content": "q"}]
    assert served.turn(prompt) == 0
    assert served.turn(prompt + OUTPUT[:4]) == 1  # a retry of turn 1 asks for turn 1 again
    assert served.turn(prompt + OUTPUT[:6]) == 2
    # An agent that drops ids: the model turns in its input beyond the prompt's own.
    bare = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in OUTPUT[:6]]
    assert served.turn(prompt + bare) == 2
    # Ids a model reuses in every turn say nothing: call_0 in turns 0 and 1.
    same = [[call("call_0", fid="fc_1")], [call("call_0", fid="fc_2")], [say("x")]]
    served = _Served(PlanEntry("0:0", "0:0", same))
    assert served.turn([*prompt, same[0][0], out("call_0", "r")]) == 1


def _record(output: list[object], reward: float = 1.0, **fields: object) -> dict[str, object]:
    return {"responses_create_params": {"input": "q"}, "response": {"output": output},
            "reward": reward, **fields}  # fmt: skip


def test_the_first_divergence_in_order() -> None:
    old = _record(OUTPUT, tool_called=1, rollgym_timing={"total_s": 1.0}, agent_seconds=0.1)
    # Fresh ids for the environment's items, other timings: identical.
    fresh = [dict(i, id="fco_new") if i["type"] == "function_call_output" else i for i in OUTPUT]
    assert first_divergence(old, _record(fresh, tool_called=1, agent_seconds=9.0)) is None
    changed = list(OUTPUT)
    changed[5] = out("c", "4")
    d = first_divergence(old, _record(changed, reward=0.0, tool_called=1))
    assert d is not None and (d.turn, d.field, d.recorded, d.replayed) == (
        1,
        "tool output",
        "3",
        "4",
    )
    d = first_divergence(old, _record(OUTPUT, reward=0.0, tool_called=1))
    assert d is not None and (d.turn, d.field) == (3, "reward")
    d = first_divergence(old, _record(OUTPUT, tool_called=2))
    assert d is not None and (d.field, d.key, d.recorded, d.replayed) == (
        "verifier field",
        "tool_called",
        1,
        2,
    )
    d = first_divergence(old, _record(OUTPUT[:4], tool_called=1))
    assert d is not None and (d.turn, d.field) == (1, "turns")
    # Gymnasium: a step's reward at its turn.
    d = first_divergence(
        _record(OUTPUT, step_rewards=[0, 0, 1]), _record(OUTPUT, step_rewards=[0, 1, 1])
    )
    assert d is not None and (d.turn, d.field) == (1, "step reward")
    # A fork compares its first k turns only.
    assert first_divergence(old, _record(changed, reward=0.0), turns=1) is None


def _run_json(folder: Path, **info: object) -> Path:
    folder.mkdir()
    (folder / "run.json").write_bytes(orjson.dumps(info))
    return folder


def test_the_environment_is_compared_by_fingerprints_when_both_runs_carry_them(
    tmp_path: Path,
) -> None:
    code = {"env": {"file": "e.py", "sha256": "aa"}, "model": {"sha256": "m1"}}
    fp = {"env": {"id": "1", "code": {"digest": "c"}, "data": {"digest": "d"}, "version": "1"}}
    a = _run_json(tmp_path / "a", code=code)
    b = _run_json(tmp_path / "b", code={**code, "model": {"sha256": "m2"}})
    assert environment_change(a, b, {"model"}) == {
        "fingerprints": "unknown",
        "code": "same",
        "differs": False,
    }
    edited = {"env": {**fp["env"], "id": "2", "data": {"digest": "d2"}}}
    c = _run_json(tmp_path / "c", code=code, fingerprints=fp)
    d = _run_json(tmp_path / "d", code=code, fingerprints=edited)
    got = environment_change(c, d, {"model"})
    assert got["differs"] and got["fingerprint_changes"] == {"env": ["data"]}
    assert environment_change(c, c, set())["fingerprints"] == "same"
    # One side only, or a foreign server's unknown id on both: no evidence of "same".
    e = _run_json(tmp_path / "e", code=code, fingerprints={**fp, "judge": {"id": "9"}})
    assert environment_change(c, e, set())["fingerprints_unknown"] == ["judge"]
    assert environment_change(c, e, set())["fingerprints"] == "unknown"
    f = _run_json(tmp_path / "f", code=code, fingerprints={"env": {"id": None, "unknown": "404"}})
    assert environment_change(f, f, set())["fingerprints"] == "unknown"


def test_a_rollout_is_found_by_either_spelling_of_its_id(tmp_path: Path) -> None:
    from rollgym.config import ServerConfig
    from rollgym.replay.model import ReplayModel
    from rollgym.server.base import ServerContext

    plan = tmp_path / "plan.jsonl"
    plan.write_bytes(PlanEntry("4:0", "9:2", [[say("x")]]).to_line())
    cfg = ServerConfig(kind="model", impl="rollgym.replay.model:ReplayModel",
                       options={"plan": str(plan)})  # fmt: skip
    model = ReplayModel(ServerContext("model", cfg))
    assert model._served("4:0") is model._served("4-0") is model._served("4-0-a1") is not None
    assert model._served("5:0") is None and model._served(None) is None


def test_a_fingerprint_unknown_in_either_run_is_no_difference(tmp_path: Path) -> None:
    """A server whose fingerprint is unknown in one run (a replica that did not answer in
    time, a foreign server) or in both for different reasons cannot be told to differ: the
    replay says ``unknown``, never ``differ`` (which reads as a verifier changed)."""
    code = {"env": {"file": "e.py", "sha256": "aa"}}
    known = {"env": {"id": "1", "code": {"digest": "c"}, "data": {"digest": "d"}}}
    slow = {"env": {"id": None, "unknown": "no /fingerprint (deadline_exceeded: 5s ran out)"}}
    foreign = {"env": {"id": None, "unknown": "no /fingerprint (http_status_error: 404)"}}
    a = _run_json(tmp_path / "a", code=code, fingerprints=known)
    b = _run_json(tmp_path / "b", code=code, fingerprints=slow)
    c = _run_json(tmp_path / "c", code=code, fingerprints=foreign)
    for one, two in ((a, b), (b, a), (b, c)):
        got = environment_change(one, two, set())
        assert got["fingerprints"] == "unknown" and got["fingerprints_unknown"] == ["env"], got
        assert not got["differs"] and "fingerprint_changes" not in got
