"""The payload texts compaction and the index show (``prompt_and_response``, through
``span_texts``) are decoded by orjson first; the answers must be the stdlib decoder's exactly:
integers beyond 64 bits (which orjson reads as floats), negative ones, NaN and infinities, lone
surrogates, a BOM, deep nesting, damaged JSON."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_verl import semconv
from otel_verl.store import _record
from otel_verl.store._record import _fast_json, _prompt_and_response
from otel_verl.store._record import json_or_none as _json_or_none
from otel_verl.store._record import prompt_and_response as fast

_BIG = st.one_of(st.integers(2**63 - 2, 2**63 + 2), st.integers(2**64 - 2, 2**64 + 2),
                 st.integers(-(2**64) - 2, -(2**63) + 2), st.integers(-(2**200), 2**200))
_LEAF = st.one_of(st.none(), st.booleans(), _BIG, st.integers(), st.floats(),
                  st.text(max_size=8), st.sampled_from(["\ud800", "\ufeff", "x\udfffy"]))
_VALUE = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)
_ROLE = st.sampled_from(["user", "assistant", "system", 2**64, None])


@st.composite
def _message(draw: Any) -> Any:
    content = draw(st.one_of(_VALUE, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": _VALUE}), max_size=3)))
    message: dict[str, Any] = {"role": draw(_ROLE), "content": content}
    if draw(st.booleans()):
        message["parts"] = draw(st.lists(st.fixed_dictionaries({"content": _VALUE}),
                                         max_size=3))
        if draw(st.booleans()):
            del message["content"]
    return message


def _dumps(draw: Any, value: Any) -> str:
    text = json.dumps(value, ensure_ascii=draw(st.booleans()))
    cut = draw(st.sampled_from([None, None, None, -1, len(text) // 2]))
    return text if cut is None else text[:cut]  # damaged JSON too


@st.composite
def _span(draw: Any) -> dict[str, Any]:
    messages = draw(st.lists(_message(), max_size=4))
    attributes: dict[str, Any] = {}
    shape = draw(st.sampled_from(["raw_prompt", "messages", "kwargs", "prompt"]))
    body: Any = {"raw_prompt": messages} if shape == "raw_prompt" else {"messages": messages}
    if shape == "kwargs":
        body = {"kwargs": {"messages": messages}}
    if shape == "prompt":
        body = {"prompt": draw(_VALUE)}
    attributes[semconv.INPUT_VALUE] = _dumps(draw, body)
    out = draw(st.sampled_from(["extra", "messages", "response_text", "none"]))
    if out != "none":
        answer: Any = {"response_text": draw(_VALUE)} if out == "response_text" else (
            {"extra_fields": {"messages": messages}} if out == "extra" else {"messages": messages})
        attributes[semconv.OUTPUT_VALUE] = _dumps(draw, answer)
    for key in (semconv.GEN_AI_INPUT_MESSAGES, semconv.GEN_AI_OUTPUT_MESSAGES):
        if draw(st.booleans()):
            attributes[key] = _dumps(draw, draw(st.lists(_message(), max_size=3)))
    return {"attributes": attributes, "name": "s"}


def _stdlib(span: dict[str, Any]) -> tuple[str | None, str | None]:
    """The answer with every payload through the stdlib decoder (the reference)."""
    return _prompt_and_response(span, _json_or_none, str)


@settings(max_examples=400, deadline=None)
@given(span=_span())
def test_prompt_and_response_is_the_stdlib_decoders(span: dict[str, Any]) -> None:
    assert fast(span) == _stdlib(span)


def _content_span(content_json: str) -> dict[str, Any]:
    return {"attributes": {semconv.INPUT_VALUE:
                           '{"messages": [{"role": "user", "content": ' + content_json + "}]}"}}


def test_huge_integers_print_as_the_stdlib_reads_them() -> None:
    for value in (2**64, 2**64 + 1, -(2**63) - 1, -(2**70), 10**40, 2**64 - 1, -(2**63)):
        for content in (str(value), f'[{{"type": "text", "text": {value}}}]',
                        f'{{"n": [{value}, 1.5]}}'):
            span = _content_span(content)
            assert fast(span) == _stdlib(span)
        assert fast(_content_span(str(value)))[0] == str(value)
    # a float of the same magnitude prints as the stdlib's float (not as orjson's integer)
    assert fast(_content_span("1e19"))[0] == "1e+19"


def test_what_orjson_refuses_is_the_stdlib_decoders() -> None:
    for content in ("NaN", "-Infinity", "1e400", '"\\ud800"', "[1, 2,", '"a"\x00'):
        span = _content_span(content)
        assert fast(span) == _stdlib(span)
    assert fast(_content_span("NaN"))[0] == "nan"
    assert _fast_json("\ufeff[1]") is None  # a BOM: the stdlib refuses it too


def test_deep_nesting_is_the_stdlib_decoders() -> None:
    """orjson reads 1,024 levels; the stdlib fewer (None where it cannot); a value the stdlib
    reads prints as it did (no recursion error of our own on the way)."""
    for depth in (10, 500, 600, 700, 800, 900, 1000, 1023, 1030, 5000):
        text = "[" * depth + "]" * depth
        assert _fast_json(text) == _json_or_none(text)
        for content in (text, f'[{{"type": "text", "text": {text}}}]', f'{{"a": {text}}}'):
            span = _content_span(content)
            assert fast(span) == _stdlib(span)


@settings(max_examples=300, deadline=None)
@given(value=_VALUE, ascii_only=st.booleans())
def test_fast_json_is_json_loads_but_for_rounded_integers(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    got, want = _fast_json(text), _json_or_none(text)
    if _record._maybe_rounded(got):
        return  # printed only through _exact_text, which sends it to the stdlib
    assert _same(got, want)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
