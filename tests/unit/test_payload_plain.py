"""The plain-value fast path of ``to_payload``: a small value made of exact JSON types is encoded
as it is, and the result is exactly what the budgeted walk gives (text, cut, redaction count,
error), for any value (hypothesis), including the cases it must leave to the walk."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl import _payload
from otel_verl._payload import to_payload

_keys = st.one_of(st.text(max_size=12), st.sampled_from(
    ["api_key", "password", "max_tokens", "prompt_ids", "token", "x" * 300, "Authorization"]))
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["\ud800 lone", "é" * 50, "a" * 5000]))
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.lists(inner, max_size=8).map(tuple),
                            st.dictionaries(_keys, inner, max_size=6)),
    max_leaves=40)


def _walked(value: Any, max_bytes: int, redact: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(_payload, "_plain_json", lambda *_: None)
        return to_payload(value, max_bytes=max_bytes, redact=redact)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_values, max_bytes=st.sampled_from([256, 1024, 65536]), redact=st.booleans())
def test_fast_path_equals_the_walk(value: Any, max_bytes: int, redact: bool,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fast = to_payload(value, max_bytes=max_bytes, redact=redact)
    slow = _walked(value, max_bytes, redact, monkeypatch)
    assert (fast.json, fast.truncated, fast.redacted, fast.error) == \
        (slow.json, slow.truncated, slow.redacted, slow.error)


def test_a_small_plain_input_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op's bound inputs (a dict of plain values) skip the walk: it is not even built."""
    def no_walk(*_: Any) -> Any:
        raise AssertionError("walked")

    monkeypatch.setattr(_payload, "_Walker", no_walk)
    value = {"request_id": "r1", "prompt_ids": [1, 2, 3], "sampling_params":
             {"temperature": 1.0, "max_tokens": 256, "stop": None, "n": True}}
    payload = to_payload(value, max_bytes=65536, redact=True)
    assert payload.error is None and not payload.truncated
    assert payload.json == ('{"request_id":"r1","prompt_ids":[1,2,3],"sampling_params":'
                            '{"temperature":1.0,"max_tokens":256,"stop":null,"n":true}}')


@pytest.mark.parametrize("value", [
    {"api_key": "sk-live"},                       # a key to redact
    {"x": math.nan},                              # NaN: the walk writes "nan"
    {"x": "\ud800"},                              # a lone surrogate
    {"x": 2**65},                                 # beyond 64 bits: written as a string
    {1: "int key"},                               # a non-str key
    {"x": "a" * 20000},                           # over the share of the cap: may be cut
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],  # deeper than MAX_DEPTH
])
def test_what_the_walk_must_decide_is_left_to_it(value: Any) -> None:
    assert _payload._plain_json(value, 65536, True) is None


@dataclasses.dataclass
class _Out:
    token_ids: Any
    finish_reason: Any = None
    log_probs: Any = None


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=_values, b=_values, c=_values, redact=st.booleans())
def test_a_dataclass_output_equals_the_walk(a: Any, b: Any, c: Any, redact: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    value = _Out(a, b, c)
    fast = to_payload(value, max_bytes=4096, redact=redact)
    slow = _walked(value, 4096, redact, monkeypatch)
    assert (fast.json, fast.truncated, fast.redacted, fast.error) == \
        (slow.json, slow.truncated, slow.redacted, slow.error)


def test_a_small_dataclass_output_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_walk(*_: Any) -> Any:
        raise AssertionError("walked")

    monkeypatch.setattr(_payload, "_Walker", no_walk)
    payload = to_payload(_Out([5, 6], "stop"), max_bytes=65536, redact=True)
    assert payload.json == '{"token_ids":[5,6],"finish_reason":"stop","log_probs":null}'


# nested plain dataclasses and lists of token ids (``_plain_json`` takes them too) -------------


@dataclasses.dataclass
class _Call:
    name: Any
    arguments: Any = None


@dataclasses.dataclass
class _Secret:
    api_key: Any = "k"
    raw: Any = None


@dataclasses.dataclass
class _Broken:
    field: Any

    def __post_init__(self) -> None:
        object.__delattr__(self, "field")  # reading it raises


class _Mapping(dict):  # type: ignore[type-arg]
    pass


_tokens = st.builds(lambda n, big: [2**65 if big and i == n // 2 else i for i in range(n)],
                    st.integers(0, 3000), st.booleans())
_nested = st.recursive(
    st.one_of(_leaves, _tokens, st.builds(lambda n: [True, None] * n, st.integers(0, 40)),
              st.builds(_Broken, st.none()), st.just(_Mapping(a=1))),
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(_keys, inner, max_size=5),
                            st.builds(_Call, inner, inner), st.builds(_Secret, inner, inner)),
    max_leaves=25)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=_nested, max_bytes=st.sampled_from([256, 1024, 8192, 65536]),
       redact=st.booleans())
def test_nested_dataclasses_and_token_lists_equal_the_walk(value: Any, max_bytes: int,
                                                           redact: bool,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    fast = to_payload(value, max_bytes=max_bytes, redact=redact)
    slow = _walked(value, max_bytes, redact, monkeypatch)
    assert (fast.json, fast.truncated, fast.redacted, fast.error) == \
        (slow.json, slow.truncated, slow.redacted, slow.error)


@pytest.mark.parametrize("value", [
    ("", [_Call("calculator", {"expression": "12*7"})]),  # a tool parser's (text, calls)
    {"request_id": "r", "prompt_ids": list(range(1000)), "sampling_params": {"t": 1.0}},
])
def test_tool_calls_and_token_heads_are_not_walked(value: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def no_walk(*_: Any) -> Any:
        raise AssertionError("walked")

    slow = to_payload(value, max_bytes=65536, redact=True)
    monkeypatch.setattr(_payload, "_Walker", no_walk)
    assert to_payload(value, max_bytes=65536, redact=True) == slow


# hostile inputs: what the fast path must refuse or render exactly as the walk does ------------


class _Str(str):
    pass


class _Int(int):
    pass


class _Color(enum.Enum):
    RED = 1
    NAN = math.nan
    TEXT = "t"


_hostile_leaves = st.one_of(
    _leaves, st.just(_Str("sub")), st.just(_Int(7)), st.sampled_from(list(_Color)),
    st.just(uuid.UUID(int=5)), st.just(datetime.date(2024, 1, 2)), st.just(_Mapping(a=1)),
    st.just(float("inf")), st.just(-(2**63)), st.just(2**64 - 1), st.just(2**64),
    st.builds(lambda n: list(range(n)), st.integers(15, 40)),
    st.builds(lambda n: [1] * n + ["x"], st.integers(15, 40)),
    st.builds(lambda n: [1] * n + [math.nan], st.integers(15, 40)),
    st.builds(lambda n: [True] * n, st.integers(15, 40)),
    st.builds(lambda n: [1] * n + [_Int(2)], st.integers(15, 40)))
_hostile_keys = st.one_of(_keys, st.just(_Str("api_key")), st.just("k" * 256),
                          st.just("k" * 257), st.just("\udc80"), st.just("session_token"))
_hostile = st.recursive(
    _hostile_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_hostile_keys, inner, max_size=5),
        st.dictionaries(st.one_of(st.integers(), _hostile_keys), inner, max_size=3),
        st.builds(_Call, inner, inner), st.builds(_Secret, inner, inner)),
    max_leaves=30)


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=_hostile, max_bytes=st.sampled_from([256, 1024, 8192, 65536]),
       redact=st.booleans())
def test_hostile_values_equal_the_walk(value: Any, max_bytes: int, redact: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Subclasses of str/int/dict, enums (one whose value is NaN), UUIDs, dates, big ints, NaN
    and inf, lone surrogates (in keys too), keys at and over ``MAX_KEY_CHARS``, secret keys at
    any depth (with None values too), int lists with one odd item, bools beside ints."""
    fast = to_payload(value, max_bytes=max_bytes, redact=redact)
    slow = _walked(value, max_bytes, redact, monkeypatch)
    assert (fast.json, fast.truncated, fast.redacted, fast.error) == \
        (slow.json, slow.truncated, slow.redacted, slow.error)


def test_key_checks_are_remembered_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dict's keys are checked once per shape (length, redaction), not on every call; a
    shape with a secret key is never remembered."""
    calls: list[str] = []
    real = _payload.is_sensitive_key

    def counting(key: str) -> bool:
        calls.append(key)
        return real(key)

    monkeypatch.setattr(_payload, "is_sensitive_key", counting)
    _payload._KEYS_OK.clear()
    value = {"request_id": "r", "sampling_params": {"temperature": 1.0}}
    for _ in range(5):
        assert _payload._plain_json(value, 65536, True) is not None
    assert sorted(calls) == ["request_id", "sampling_params", "temperature"]
    calls.clear()
    for _ in range(3):
        assert _payload._plain_json({"api_key": "k"}, 65536, True) is None
        assert _payload._plain_json({"api_key": "k"}, 65536, False) == '{"api_key":"k"}'
    assert calls == ["api_key"] * 6
