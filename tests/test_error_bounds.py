"""Errors stay small whatever an upstream sends: messages and bodies are bounded at every level
of the ``origin`` chain, the chain's depth is bounded, and any text serialises."""

from __future__ import annotations

import pickle

import orjson

from rollgym.errors import (
    BODY_LIMIT,
    MESSAGE_LIMIT,
    ORIGIN_DEPTH,
    HTTPStatusError,
    InternalError,
    RollgymError,
)


def test_a_ten_megabyte_message_is_cut_at_every_level_of_the_chain() -> None:
    huge = "x" * 10_000_000
    inner = InternalError(huge, server="model", body=huge)
    outer = HTTPStatusError(huge, status=502, server="agent", body=huge, origin=inner)
    for err in (outer, outer.origin):
        assert err is not None
        assert len(err.message) < MESSAGE_LIMIT + 100
        assert "more characters cut" in err.message
        assert err.body is not None and len(err.body) <= BODY_LIMIT and err.truncated
    assert len(pickle.dumps(outer)) < 40_000
    assert len(str(outer)) < 3 * MESSAGE_LIMIT
    copy = outer.with_fields(message=huge)
    assert len(copy.message) < MESSAGE_LIMIT + 100
    back = RollgymError.from_dict(orjson.loads(orjson.dumps(outer.to_dict())))
    assert back == outer


def test_an_origin_chain_is_cut_to_its_maximum_depth() -> None:
    err: RollgymError | None = None
    for hop in range(50):
        err = HTTPStatusError(f"hop {hop}", status=502, server=f"s{hop}", origin=err)
    assert err is not None
    depth, node = 0, err
    while node is not None:
        depth += 1
        node = node.origin
    assert depth == ORIGIN_DEPTH
    assert err.message == "hop 49"  # the outermost errors are kept, the deepest dropped
    assert pickle.loads(pickle.dumps(err)) == err


def test_a_short_chain_is_kept_as_it_is() -> None:
    inner = InternalError("boom", server="model")
    outer = HTTPStatusError("bad gateway", status=502, server="agent", origin=inner)
    assert outer.origin is inner


def test_lone_surrogates_in_a_body_or_message_serialise() -> None:
    err = HTTPStatusError("bad \ud800 text", status=500, body="body \udc00 here", server="m")
    data = orjson.loads(orjson.dumps(err.to_dict()))
    assert data["body"].startswith("body ") and data["body"].endswith(" here")
    assert data["message"].startswith("bad ")
    assert pickle.loads(pickle.dumps(err)) == err
