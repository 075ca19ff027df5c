"""Every rollgym error is a plain value: it pickles, survives a ``spawn`` process, converts to
and from JSON, keeps its body bounded and carries no credentials."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollgym import errors
from rollgym.config import RetryPolicy
from rollgym.errors import (
    ALL_ERRORS,
    BODY_LIMIT,
    ConnectError,
    HTTPStatusError,
    RollgymError,
    bound_body,
    redact_text,
    redact_url,
)
from rollgym.http import HttpClient, Target
from rollgym.testing import serve_asgi

PLAIN = (str, int, float, bool, type(None), RollgymError)


def full_kwargs(cls: type[RollgymError]) -> dict[str, Any]:
    """Every field set, and ``retryable`` the opposite of the class default (so it must travel)."""
    origin = ConnectError(
        "cannot connect to model at 127.0.0.1:9",
        url="http://127.0.0.1:9/v1/responses",
        method="POST",
        server="model",
        endpoint="/v1/responses",
        attempts=2,
    )
    return {
        "message": f"{cls.__name__} happened",
        "status": 503,
        "body": '{"detail": "NaN in logprobs"}',
        "truncated": True,
        "url": "http://127.0.0.1:8000/run",
        "method": "POST",
        "server": "agent",
        "endpoint": "/run",
        "attempts": 3,
        "retryable": not cls.default_retryable,
        "origin": origin,
    }


def make(cls: type[RollgymError]) -> RollgymError:
    kwargs = full_kwargs(cls)
    return cls(kwargs.pop("message"), **kwargs)


def assert_same(got: BaseException, want: RollgymError) -> None:
    assert type(got) is type(want)
    assert isinstance(got, RollgymError)
    for name, value in want.fields().items():
        if name == "origin":
            continue
        assert getattr(got, name) == value, name
    if want.origin is None:
        assert got.origin is None
    else:
        assert got.origin is not None
        assert_same(got.origin, want.origin)
    assert got == want
    assert str(got) == str(want)
    assert got.args == want.args


def assert_plain(err: RollgymError) -> None:
    for name, value in vars(err).items():
        assert isinstance(value, PLAIN), f"{type(err).__name__}.{name} is {type(value).__name__}"
    if err.origin is not None:
        assert_plain(err.origin)


def _raise(cls: type[RollgymError], kwargs: dict[str, Any]) -> None:
    """Run in a spawned child: build the error there and raise it."""
    kwargs = dict(kwargs)
    raise cls(kwargs.pop("message"), **kwargs)


def _reraise(err: RollgymError) -> None:
    """Run in a spawned child: raise an error that came from the parent."""
    raise err


def _ok() -> str:
    return "ok"


@pytest.fixture(scope="module")
def spawn_pool() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        yield pool


def test_all_errors_lists_the_whole_tree() -> None:
    assert RollgymError in ALL_ERRORS
    assert {c.type for c in ALL_ERRORS} == set(errors._REGISTRY)
    assert len({c.type for c in ALL_ERRORS}) == len(ALL_ERRORS)
    assert all(issubclass(c, RollgymError) for c in ALL_ERRORS)
    assert len(ALL_ERRORS) >= 16


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_field_is_kept_as_given(cls: type[RollgymError]) -> None:
    kwargs = full_kwargs(cls)
    err = make(cls)
    for name, value in kwargs.items():
        assert getattr(err, name) == value, name
    assert err.args == (kwargs["message"],)
    assert err.root() is err.origin
    assert_plain(err)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_pickle_round_trip_keeps_type_and_fields(cls: type[RollgymError]) -> None:
    err = make(cls)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert_same(back, err)
        assert_plain(back)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_raised_error_pickles_with_its_fields(cls: type[RollgymError]) -> None:
    # Raised from a foreign exception (as translate does): the cause does not ride along.
    try:
        try:
            raise aiohttp.ClientPayloadError("broken")
        except aiohttp.ClientError as exc:
            raise make(cls) from exc
    except RollgymError as caught:
        back = pickle.loads(pickle.dumps(caught))
    assert_same(back, make(cls))
    assert back.__cause__ is None


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_json_round_trip_keeps_type_and_fields(cls: type[RollgymError]) -> None:
    err = make(cls)
    data = err.to_dict()
    assert data["type"] == cls.type
    assert data["origin"]["type"] == "connect_error"
    text = orjson.dumps(data)  # raises if anything is not JSON
    back = RollgymError.from_dict(orjson.loads(text))
    assert_same(back, err)
    assert_plain(back)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_the_compact_record_round_trips_too(cls: type[RollgymError]) -> None:
    """``to_record`` (failures.jsonl) leaves out what says nothing; ``from_dict`` restores it:
    the same error, as from ``to_dict`` (whose lines older runs hold)."""
    for err in (make(cls), cls("m"), cls("m", retryable=not cls.default_retryable, attempts=2)):
        data = orjson.loads(orjson.dumps(err.to_record()))
        assert data["type"] == cls.type and data["message"] == err.message
        assert RollgymError.from_dict(data) == err == RollgymError.from_dict(err.to_dict())
        assert len(orjson.dumps(data)) <= len(orjson.dumps(err.to_dict()))
    bare = cls("m").to_record()
    assert set(bare) <= {"type", "message", "retryable", *cls.extra_fields}, bare


def test_the_record_leaves_out_a_relays_bare_envelope_only() -> None:
    """A relay's body that is only rollgym's error envelope restates its origin: the record
    leaves it out. The root's body, and any body that says more, stay."""
    root = HTTPStatusError("upstream answered 500", status=500, body='{"error":"x"}')
    envelope = '{"error":{"type":"upstream_error","status":502,"server":"model","retryable":false}}'
    relay = HTTPStatusError("model answered 502", status=502, body=envelope, origin=root)
    record = relay.to_record()
    assert "body" not in record and record["origin"]["body"] == '{"error":"x"}'
    said = envelope.replace('"retryable":false', '"retryable":false,"detail":"nan logprob"')
    assert HTTPStatusError("m", status=502, body=said, origin=root).to_record()["body"] == said
    assert HTTPStatusError("m", status=502, body=envelope).to_record()["body"] == envelope
    assert RollgymError.from_dict(record).origin == root


def test_from_dict_of_an_unknown_type_is_the_root_error() -> None:
    back = RollgymError.from_dict({"type": "upstream_error", "message": "m", "status": 502})
    assert type(back) is RollgymError
    assert (back.message, back.status) == ("m", 502)


def test_from_dict_without_retryable_keeps_the_class_default() -> None:
    assert RollgymError.from_dict({"type": "connect_error", "message": "x"}).retryable is True
    assert RollgymError.from_dict({"type": "http_status", "message": "x"}).retryable is False


def test_every_class_of_the_tree_reads_back_as_itself() -> None:
    # A class without a wire type of its own reads back from JSON as its parent, and a failure
    # record can no longer say which it was (WaitedTooLong once read back as DeadlineExceeded).
    classes = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, RollgymError)
    }
    assert classes == set(ALL_ERRORS)
    waited = errors.WaitedTooLong("no free worker within 30s", server="math")
    back = RollgymError.from_dict(orjson.loads(orjson.dumps(waited.to_dict())))
    assert type(back) is errors.WaitedTooLong and back.type == "waited_too_long"


def test_subclass_without_its_own_type_does_not_take_over_the_parent_records() -> None:
    class Custom(HTTPStatusError):
        pass

    assert errors._REGISTRY["http_status"] is HTTPStatusError
    assert type(RollgymError.from_dict({"type": "http_status", "message": "x"})) is HTTPStatusError


def test_spawn_child_error_arrives_with_type_and_fields(
    spawn_pool: ProcessPoolExecutor,
) -> None:
    for cls in ALL_ERRORS:
        future = spawn_pool.submit(_raise, cls, full_kwargs(cls))
        with pytest.raises(cls) as info:
            future.result(timeout=60)
        assert_same(info.value, make(cls))
        assert_plain(info.value)
        # The pool survived the error and keeps working.
        assert spawn_pool.submit(_ok).result(timeout=60) == "ok"


def test_with_fields_bounds_and_redacts_new_values() -> None:
    err = HTTPStatusError("x", status=500)
    changed = err.with_fields(
        attempts=3, body="y" * (2 * BODY_LIMIT), url="http://u:pw@h/x?token=abc"
    )
    assert type(changed) is HTTPStatusError
    assert changed.attempts == 3 and err.attempts == 1
    assert changed.body is not None and len(changed.body) == BODY_LIMIT and changed.truncated
    assert changed.url == "http://h/x?token=REDACTED"
    with pytest.raises(TypeError):
        err.with_fields(headers={"a": "b"})


def test_foreign_origin_is_kept_as_a_plain_record() -> None:
    err = HTTPStatusError("x", origin=ValueError("bad value"))  # type: ignore[arg-type]
    assert type(err.origin) is RollgymError
    assert err.origin.message == "ValueError: bad value"
    assert_plain(err)


# --- bounded bodies --------------------------------------------------------------------------


def test_large_body_is_cut_to_the_limit_and_flagged() -> None:
    body = "x" * (100 * 1024)
    for given in (body, body.encode()):
        err = HTTPStatusError("big", status=500, body=given)
        assert err.body is not None and len(err.body) == BODY_LIMIT
        assert err.truncated is True
        back = pickle.loads(pickle.dumps(err))
        assert back.body == err.body and back.truncated is True
        assert len(orjson.dumps(err.to_dict())) < 2 * BODY_LIMIT


def test_body_at_the_limit_is_not_truncated() -> None:
    err = HTTPStatusError("ok", body="x" * BODY_LIMIT)
    assert err.truncated is False
    assert err.body is not None and len(err.body) == BODY_LIMIT


def test_multibyte_body_cut_by_bytes_is_flagged() -> None:
    # 5000 four-byte characters: the first 4 * BODY_LIMIT bytes decode to exactly BODY_LIMIT
    # characters, and the rest was still cut off.
    text, truncated = bound_body(("\U0001f600" * 5000).encode())
    assert text is not None and len(text) == BODY_LIMIT
    assert truncated is True


def test_truncated_flag_set_by_caller_is_kept() -> None:
    assert HTTPStatusError("x", body="short", truncated=True).truncated is True
    assert HTTPStatusError("x", body=None).truncated is False


# --- redaction -------------------------------------------------------------------------------


def test_url_redaction_drops_userinfo_and_secret_params() -> None:
    url = "http://user:pw@host/x?api_key=SECRET&q=1"
    red = redact_url(url)
    assert red is not None
    assert "pw" not in red and "SECRET" not in red and "user" not in red
    assert red.startswith("http://host/x?")
    assert "q=1" in red
    err = HTTPStatusError("failed", url=url, status=500)
    for shown in (
        err.url or "",
        str(err),
        repr(err),
        orjson.dumps(err.to_dict()).decode(),
        pickle.dumps(err).decode("latin-1"),
    ):
        assert "pw" not in shown and "SECRET" not in shown


def test_url_redaction_masks_key_in_path_and_drops_fragment() -> None:
    red = redact_url("https://h/v1/keys/sk-abcdefghijklmnop/x?token=t1#frag")
    assert red == "https://h/v1/keys/REDACTED/x?token=REDACTED"


@pytest.mark.parametrize(
    "secret",
    [
        "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
        "sk-proj-ABCDEFGH12345678",
        "sk-ant-api03-xyzXYZ0123",
    ],
)
def test_tokens_in_message_and_body_are_masked(secret: str) -> None:
    token = secret.split()[-1]
    message = f"upstream said: Authorization: {secret} is invalid"
    body = '{"error": "invalid key ' + secret + '", "echo": {"authorization": "' + secret + '"}}'
    err = HTTPStatusError(message, status=401, body=body, origin=HTTPStatusError(message))
    shown = [
        err.message,
        err.body or "",
        str(err),
        repr(err),
        repr(err.args),
        orjson.dumps(err.to_dict()).decode(),
        pickle.dumps(err).decode("latin-1"),
    ]
    for text in shown:
        assert token not in text
    assert "REDACTED" in err.message and "REDACTED" in (err.body or "")
    assert "is invalid" in err.message  # the rest of the message stays readable


def test_secret_straddling_the_cut_is_masked() -> None:
    key = "sk-" + "A" * 40
    body = "x" * (BODY_LIMIT - 11) + " " + key
    text, truncated = bound_body(body)
    assert truncated is False  # the masked key is shorter: the whole redacted body fits
    assert text is not None and "AAAAAAA" not in text


def test_redact_text_leaves_ordinary_text_alone() -> None:
    text = "the answer is 42; risk-free rate; task-0001"
    assert redact_text(text) == text


# --- a real aiohttp request ------------------------------------------------------------------

UNAVAILABLE = "model overloaded: NaN in logprobs, try later"


async def unavailable(request: Request) -> PlainTextResponse:
    await request.body()
    return PlainTextResponse(UNAVAILABLE, status_code=503)


def unavailable_app() -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", unavailable, methods=["POST"])])


@pytest.mark.timeout(30)
async def test_real_503_through_the_client_is_a_plain_picklable_error(
    spawn_pool: ProcessPoolExecutor,
) -> None:
    async with serve_asgi(unavailable_app()) as url, HttpClient() as client:
        target = Target.single("vllm", url, RetryPolicy(max_attempts=1))
        with pytest.raises(HTTPStatusError) as info:
            await client.call(target, "/v1/chat/completions", {"messages": []})
    err = info.value
    assert type(err) is HTTPStatusError
    assert err.status == 503
    assert err.body == UNAVAILABLE
    assert err.server == "vllm"
    assert err.endpoint == "/v1/chat/completions"
    assert err.method == "POST"
    assert err.attempts == 1
    assert err.url == f"{url}/v1/chat/completions"
    assert_plain(err)
    back = pickle.loads(pickle.dumps(err))
    assert_same(back, err)
    assert_same(RollgymError.from_dict(orjson.loads(orjson.dumps(err.to_dict()))), err)
    # And across a process boundary, there and back.
    with pytest.raises(HTTPStatusError) as crossed:
        spawn_pool.submit(_reraise, err).result(timeout=60)
    assert_same(crossed.value, err)


@pytest.mark.timeout(30)
async def test_aiohttp_client_response_error_does_not_survive_pickle() -> None:
    """The contrast that motivates rollgym's error tree.

    What happens (aiohttp 3.x, multidict 6/7): ``ClientResponseError`` from
    ``raise_for_status()`` keeps ``request_info`` (whose ``headers`` is a ``CIMultiDictProxy``)
    and the response ``headers`` (another ``CIMultiDictProxy``); ``pickle.dumps`` raises
    ``TypeError: can't pickle multidict._multidict.CIMultiDictProxy objects``. It also never
    kept the body. Should a future aiohttp make it picklable, this test still demands that the
    fields come back; if they do, the test fails and this note needs revisiting.
    """
    async with (
        serve_asgi(unavailable_app()) as url,
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json={}) as resp,
    ):
        with pytest.raises(aiohttp.ClientResponseError) as info:
            resp.raise_for_status()
    exc = info.value
    assert exc.status == 503
    assert not any(UNAVAILABLE in str(v) for v in vars(exc).values())  # no body kept
    survived = True
    try:
        back = pickle.loads(pickle.dumps(exc))
    except TypeError as pickle_error:
        assert "CIMultiDictProxy" in str(pickle_error)
        survived = False
    else:
        survived = (
            type(back) is type(exc)
            and back.status == exc.status
            and back.message == exc.message
            and back.request_info == exc.request_info
        )
    assert not survived
