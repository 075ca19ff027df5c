"""Server-sent events read whole: parsing, and what a streamed answer means for an attempt."""

from __future__ import annotations

import orjson
import pytest

from rollgym.errors import HTTPStatusError, ProtocolError, TransportError
from rollgym.http.answer import AttemptFailed, read_stream
from rollgym.http.sse import encode_events, parse_events
from rollgym.http.translate import translate
from rollgym.http.transport import RawAnswer

WHERE = ("up", "http://127.0.0.1:1/v1/chat/completions", "/chat/completions")


def test_events_round_trip_with_done() -> None:
    events = [{"a": 1}, {"b": "x\ny"}, []]
    assert parse_events(encode_events(events)) == (events, True)
    assert parse_events(encode_events(events, done=False)) == (events, False)


def test_parsing_skips_comments_and_fields_and_joins_data_lines() -> None:
    raw = (
        b': keep-alive\r\n\r\nevent: x\r\nid: 3\r\ndata: {"a":\r\ndata: 1}\r\n\r\n'
        b'data:{"b":2}\n\ndata: [DONE]\n\ndata: {"after": true}\n\n'
    )
    assert parse_events(raw) == ([{"a": 1}, {"b": 2}], True)


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    assert parse_events(b'data: {"a": 1}\n\ndata: [DONE]') == ([{"a": 1}], True)


def _read(body: bytes, status: int = 200) -> object:
    return read_stream(RawAnswer(status, body), *WHERE)


def test_a_stream_without_done_is_a_failed_attempt_not_a_short_answer() -> None:
    with pytest.raises(AttemptFailed) as info:
        _read(encode_events([{"choices": []}], done=False))
    assert isinstance(info.value.error, ProtocolError)
    assert "ended before 'data: [DONE]'" in info.value.error.message


def test_garbled_event_json_is_a_protocol_error() -> None:
    with pytest.raises(AttemptFailed) as info:
        _read(b"data: {not json\n\ndata: [DONE]\n\n")
    assert isinstance(info.value.error, ProtocolError)


@pytest.mark.parametrize(("code", "status"), [(400, 400), (503, 503), ("oops", 500), (None, 500)])
def test_an_error_event_fails_the_attempt_with_its_status(code: object, status: int) -> None:
    event = {"error": {"message": "engine died", "code": code}}
    with pytest.raises(AttemptFailed) as info:
        _read(encode_events([{"choices": []}, event]))
    err = info.value.error
    assert isinstance(err, HTTPStatusError) and err.status == status
    assert "engine died" in err.message and err.server == "up"


def test_a_plain_json_object_is_the_whole_answer_and_an_error_status_fails() -> None:
    answer = _read(b' {"choices": []}')
    assert answer == ([], {"choices": []})
    with pytest.raises(AttemptFailed) as info:
        _read(orjson.dumps({"error": {"message": "no"}}), status=503)
    assert isinstance(info.value.error, HTTPStatusError) and info.value.error.status == 503


def test_a_value_error_that_is_not_json_is_a_final_transport_error() -> None:
    # aiohttp refuses to build a request with URL credentials and an Authorization header with
    # a ValueError: that request fails the same way every time, and is not a garbled answer.
    exc = ValueError("Cannot combine AUTHORIZATION header with AUTH argument or credentials")
    err = translate(exc, server="up", method="POST", url="http://h/x", endpoint="/x", timeout=1)
    assert type(err) is TransportError and not err.retryable
    bad_json = translate(
        orjson.JSONDecodeError("bad", "x", 0), server="up", method="POST", url="http://h/x",
        endpoint="/x", timeout=1,
    )  # fmt: skip
    assert isinstance(bad_json, ProtocolError)
