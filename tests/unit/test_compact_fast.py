"""Compaction's decoders build the same rows as the codec's path (``iter_spans`` ->
``SpanRecord`` -> ``Columns.add``): the one-pass decoder (store/_fastrows) and the columnar one
(store/_arrowrows, pyarrow.json + Arrow compute, falling back to the first): every column of
every row, the payload rows, the line counts and the problems, on the hostile store, the lake
tests' GRPO store, bench_ui's generated store, generated OTLP spans with damaged fields, and
generated canonical spans (which the columnar decoder must take)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _hostile_spans as H
import _lake_store as L
import pyarrow as pa
import pytest
from _modules import load_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_verl.store import _compact, _record, list_files
from otel_verl.store._arrowrows import add_stretch
from otel_verl.store._compact import MANIFEST, compact, decode_range, lake_dir
from otel_verl.store._schema import PAYLOAD_SCHEMA, SPAN_SCHEMA, Columns

ROOT = Path(__file__).resolve().parents[2]


def _plain(value: Any) -> Any:
    """A cell comparable with ``==`` (NaN equal to itself)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _ints(column: Any) -> Any:
    """Timestamps as their int64 nanoseconds (Python's datetime has no nanoseconds)."""
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.int64())
    if pa.types.is_list(column.type) and pa.types.is_timestamp(column.type.value_type):
        return column.cast(pa.list_(pa.int64()))
    return column


ARROW_STRETCHES = [0]  # stretches the last _decode took through store/_arrowrows


@contextlib.contextmanager
def _counting_arrow(enabled: bool) -> Iterator[None]:
    real = _compact.add_parsed

    def counted(*args: Any) -> int | None:
        lines = real(*args)
        ARROW_STRETCHES[0] += lines is not None
        return lines

    ARROW_STRETCHES[0] = 0
    _compact.add_parsed = counted
    _compact.ARROW_ROWS = enabled
    try:
        yield
    finally:
        _compact.add_parsed = real
        _compact.ARROW_ROWS = True


@contextlib.contextmanager
def _stdlib_payloads() -> Iterator[None]:
    """The viewer's text (``span_texts``) with every payload through the stdlib decoder, as it
    was before orjson decoded them first (the codec's path, the reference, runs this way)."""
    fast, exact = _record._fast_json, _record._exact_text
    _record._fast_json, _record._exact_text = _record.json_or_none, str  # type: ignore[assignment]
    try:
        yield
    finally:
        _record._fast_json, _record._exact_text = fast, exact  # type: ignore[assignment]


def _decode(paths: list[str], legacy: bool, arrow: bool = True) -> tuple[Any, ...]:
    """The rows of ``paths``: through the codec (``legacy``; its payloads through the stdlib
    decoder), else store/_fastrows line by line (``arrow=False``) or store/_arrowrows where it
    takes the stretch (the default)."""
    columns = Columns()
    counts: dict[str, int] = {}
    problems: list[str] = []
    with _counting_arrow(arrow), _stdlib_payloads() if legacy else contextlib.nullcontext():
        for path in paths:
            decode_range(path, 0, None, columns, "src#0", counts, problems, _legacy=legacy)
    spans, payload = columns.table(), columns.payload_table()
    assert spans.schema == SPAN_SCHEMA and payload.schema == PAYLOAD_SCHEMA
    return ({name: _plain(_ints(spans.column(name)).to_pylist()) for name in spans.column_names},
            {name: _plain(payload.column(name).to_pylist()) for name in payload.column_names},
            counts, problems, spans.num_rows)


def _assert_same_rows(paths: list[str], min_rows: int = 1, arrow_stretches: int = 0) -> None:
    """The codec's rows = store/_fastrows' = store/_arrowrows' (which took at least
    ``arrow_stretches`` stretches)."""
    old = _decode(paths, legacy=True)
    assert old[4] >= min_rows
    for new in (_decode(paths, legacy=False, arrow=False), _decode(paths, legacy=False)):
        for name, column in old[0].items():
            assert new[0][name] == column, name
        assert new[1] == old[1]
        assert new[2:] == old[2:]
    assert ARROW_STRETCHES[0] >= arrow_stretches


def test_hostile_store_same_rows(tmp_path: Path) -> None:
    """Every poisoned line of tests/_hostile_spans.py between good lines."""
    H.write_good_store(tmp_path, 4)
    H.poison_store(tmp_path)
    paths = [p for p in list_files(tmp_path) if ".otel_verl_lake" not in p]
    with open(paths[0], "ab") as handle:  # and a torn last line
        handle.write(b'{"resourceSpans": [{"scopeSpans": [')
    _assert_same_rows(paths, min_rows=40)


def test_hostile_between_clean_files_same_rows_in_order(tmp_path: Path) -> None:
    """Rows from the columnar decoder (tables) and from the per-line one (tuples) interleaved
    in one Columns keep their order."""
    H.write_good_store(tmp_path / "bad", 4)
    H.poison_store(tmp_path / "bad")
    L.write_store(tmp_path / "good", 3)
    bad = [p for p in list_files(tmp_path / "bad") if ".otel_verl_lake" not in p]
    good = list_files(tmp_path / "good")
    _assert_same_rows([*bad, *good, *bad, *good], min_rows=80, arrow_stretches=2)


def test_lake_store_same_rows(tmp_path: Path) -> None:
    L.write_store(tmp_path, 5)
    _assert_same_rows(list_files(tmp_path), min_rows=50, arrow_stretches=1)


def test_bench_store_same_rows_and_compacts(tmp_path: Path) -> None:
    """bench_ui's GRPO store (payloads, content references, engine spans in a second file),
    and compaction over it writes every span."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        bench_ui = load_file(ROOT / "bench" / "bench_ui.py", "bench_ui")
    finally:
        sys.path.remove(str(ROOT / "bench"))
    spans = bench_ui.generate_store(str(tmp_path), 40)
    paths = list_files(tmp_path)
    _assert_same_rows(paths, min_rows=spans, arrow_stretches=2)
    stats = compact(tmp_path, live_bytes=0)
    assert stats.spans == spans
    assert Path(lake_dir(tmp_path), MANIFEST).exists()


# --- generated spans: every field canonical or damaged ------------------------------------------

_KEYS = ["rollout.step", "rollout.sample_index", "rollout.rollout_n", "rollout.validate",
         "rollout.experiment_name", "rollout.project_name", "rollout.reward",
         "rollout.reward.format", "rollout.sampling.kept", "rollout.sampling.weight",
         "rollout.sampling.reason", "rollout.num_turns", "rollout.termination",
         "otel_verl.trajectory", "gen_ai.operation.name", "openinference.span.kind",
         "gen_ai.tool.name", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
         "gen_ai.response.finish_reasons", "gen_ai.evaluation.score.label", "error.type",
         "input.value", "output.value", "gen_ai.input.messages", "gen_ai.tool.call.arguments",
         "rollout.policy_version", "service.name", "plain"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                     st.floats(allow_nan=False), st.text(max_size=8),
                     st.sampled_from(["NaN", "-Infinity", "chat", "execute_tool", "TOOL", "LLM",
                                      "", "0", "12", "007", " 5", "1_000"]))
_TEXTS = st.sampled_from([
    '{"raw_prompt": [{"role": "user", "content": "what?"}]}',
    '{"kwargs": {"messages": [{"role": "user", "content": "hi"}]}}',
    '{"extra_fields": {"messages": [{"role": "assistant", "content": "done"}]}}',
    '{"response_text": "x", "ok": false}', '{"ok" : false}', '[{"role": "user", "content": 1}]',
    '{"prompt": "p"}', "not json", "x" * 1500, '{"messages": "no"}'])


_CANONICAL = st.one_of(
    st.builds(lambda v: {"stringValue": v}, st.one_of(st.text(max_size=10), _TEXTS,
                                                      st.sampled_from(["chat", "TOOL", "LLM"]))),
    st.builds(lambda v: {"intValue": str(v)}, st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: {"doubleValue": v}, st.floats()),
    st.builds(lambda v: {"boolValue": v}, st.booleans()))


@st.composite
def _any_value(draw: Any) -> Any:
    """Mostly what a writer sends (so the fast path runs), else any damage."""
    if draw(st.integers(0, 4)):
        return draw(_CANONICAL)
    member = draw(st.sampled_from(["stringValue", "intValue", "doubleValue", "boolValue",
                                   "arrayValue", "kvlistValue", "bytesValue", "empty", "two",
                                   "raw", "string_value"]))
    if member == "stringValue":
        return {"stringValue": draw(_SCALARS)}
    if member == "intValue":
        return {"intValue": draw(st.one_of(st.integers(-(2**64), 2**64).map(str), _SCALARS))}
    if member == "doubleValue":
        return {"doubleValue": draw(_SCALARS)}
    if member == "boolValue":
        return {"boolValue": draw(_SCALARS)}
    if member == "arrayValue":
        return {"arrayValue": {"values": [{"stringValue": "stop"}, {"intValue": "3"}]}}
    if member == "kvlistValue":
        return {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}
    if member == "bytesValue":
        return {"bytesValue": draw(st.sampled_from(["aGk=", "!!", ""]))}
    if member == "empty":
        return draw(st.sampled_from([{}, None]))
    if member == "two":
        return {"stringValue": "a", "intValue": "1"}
    if member == "string_value":
        return {"string_value": "snake"}
    return draw(_SCALARS)


_IDS = st.sampled_from(["", None, "0" * 32, "ab" * 16, "AB" * 16, "zz" * 16, "ab" * 8, "0" * 16,
                        "q83vEjRWeJA=", "q83vEjRWeJCrze8SNFZ4kA==", " a" * 8, 7])


@st.composite
def _span(draw: Any, n: int) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(_KEYS), max_size=12, unique=True))
    span: dict[str, Any] = {
        "traceId": f"{n + 1:032x}", "spanId": f"{n + 1:016x}", "name": "agent_loop",
        "kind": 1, "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": [{"key": k, "value": draw(_any_value())} for k in keys],
        "status": {}}
    for field, values in (
            ("traceId", _IDS), ("spanId", _IDS), ("parentSpanId", _IDS),
            ("parent_span_id", st.sampled_from(["ab" * 8])),
            ("trace_id", st.sampled_from(["cd" * 16])),
            ("name", st.sampled_from(["rollout.sampling_report", "", 42, "chat x"])),
            ("kind", st.sampled_from([0, 3, 6, -1, True, "SPAN_KIND_SERVER", None, 2.5])),
            ("startTimeUnixNano", st.sampled_from(["0", str(2**63), str(2**64), "-1", 5, "x",
                                                   None, 1.5])),
            ("endTimeUnixNano", st.sampled_from(["1", str(2**63 + 5), None, "1e3"])),
            ("end_time_unix_nano", st.sampled_from(["9"])),
            ("status", st.sampled_from([{"code": 2, "message": "boom"}, {"code": 2},
                                        {"code": 1}, {"code": 5}, {"code": "STATUS_CODE_ERROR"},
                                        {"message": 3}, [], None, "x"])),
            ("events", st.sampled_from([
                [{"name": "gen_ai.evaluation.result", "timeUnixNano": "5", "attributes": [
                    {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 0.5}},
                    {"key": "gen_ai.evaluation.score.label", "value": {"stringValue": "ok"}}]}],
                [{"name": "exception", "attributes": [
                    {"key": "exception.type", "value": {"stringValue": "ValueError"}}]}],
                [{"name": 5}], [{"timeUnixNano": str(2**64 + 1)}], "x", [], None])),
            ("links", st.sampled_from([[{"traceId": "ab" * 16, "spanId": "cd" * 8}], []])),
            ("attributes", st.sampled_from([{"a": 1}, "x", [{"key": "k"}], [5], None]))):
        if draw(st.integers(0, 14)) == 0:
            span[field] = draw(values)
    if draw(st.integers(0, 5)) == 0 and span["attributes"].__class__ is list:
        span["attributes"] = span["attributes"] + span["attributes"][:1]  # a repeated key
    return span


@st.composite
def _line(draw: Any) -> bytes:
    resource_attrs = [{"key": k, "value": draw(_any_value())}
                      for k in draw(st.lists(st.sampled_from(_KEYS), max_size=4, unique=True))]
    spans = [draw(_span(i)) for i in range(draw(st.integers(1, 4)))]
    rs: dict[str, Any] = {"resource": {"attributes": resource_attrs},
                          "scopeSpans": [{"scope": {"name": "s", "version": "1"}, "spans": spans}]}
    if draw(st.integers(0, 9)) == 0:
        rs = copy.deepcopy(draw(st.sampled_from([
            {"resource": {"attributes": "x"}, "scopeSpans": []},
            {"resource": [], "scopeSpans": [{"spans": spans}]},
            {"instrumentationLibrarySpans": [{"instrumentationLibrary": {"name": "old"},
                                              "spans": spans}]},
            {"scopeSpans": [{"scope": {"name": "s"}, "spans": {"x": 1}}]},
            {"scopeSpans": "x"}])))
    return json.dumps({"resourceSpans": [rs]}, allow_nan=True).encode()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(lines=st.lists(_line(), min_size=1, max_size=4))
def test_generated_spans_same_rows(tmp_path_factory: Any, lines: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("gen") / "otel_verl-gen.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        old = _decode([str(path)], legacy=True)
    except Exception as error:  # noqa: BLE001 - what the old path refuses, the new one must too
        try:
            _decode([str(path)], legacy=False)
        except Exception as fast_error:  # noqa: BLE001
            assert type(fast_error) is type(error)
            return
        raise AssertionError(f"the codec's path raised {error!r}, the fast one did not") from None
    new = _decode([str(path)], legacy=False)
    assert new[0] == old[0]
    assert new[1:] == old[1:]


# --- generated canonical spans: the columnar decoder takes them, with the same rows -----------

_CANON_TEXT = st.one_of(st.text(max_size=12), _TEXTS, st.sampled_from(
    ["chat", "TOOL", "LLM", "execute_tool", "text_completion", "é€😀", "a\\", 'q"', "null"]))
_CANON_VALUE = st.one_of(
    st.builds(lambda v: {"stringValue": v}, _CANON_TEXT),
    st.builds(lambda v: {"intValue": str(v)}, st.integers(-(10**18) + 1, 10**18 - 1)),
    st.builds(lambda v: {"doubleValue": v}, st.one_of(
        st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**60), 2**60))),
    st.builds(lambda v: {"boolValue": v}, st.booleans()))
_CANON_KEYS = [*_KEYS, "rollout.reward.correct", "rollout.sampling.dropped",
               "gen_ai.tool.call.result", "gen_ai.output.messages", "x" * 3]


@st.composite
def _canonical_attributes(draw: Any, max_size: int = 10) -> list[dict[str, Any]]:
    keys = draw(st.lists(st.sampled_from(_CANON_KEYS), max_size=max_size, unique=True))
    return [{"key": k, "value": draw(_CANON_VALUE)} for k in keys]


@st.composite
def _canonical_span(draw: Any, n: int) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": f"{draw(st.integers(1, 3)):032x}", "spanId": f"{n + 1:016x}",
        "name": draw(st.sampled_from(["agent_loop", "rollout.sampling_report", "", "é"])),
        "kind": draw(st.integers(0, 5)),
        "startTimeUnixNano": str(draw(st.integers(0, 2**63 - 1))),
        "endTimeUnixNano": str(draw(st.integers(0, 2**63 - 1))),
        "attributes": draw(_canonical_attributes()),
        "status": draw(st.sampled_from([{}, {"code": 0}, {"code": 1}, {"code": 2},
                                        {"code": 2, "message": "boom"}, {"message": "m"}])),
        "flags": 256}
    for field, values in (
            ("parentSpanId", st.sampled_from(["", "0" * 16, "ab" * 8, f"{n + 7:016x}"])),
            ("events", st.lists(st.builds(
                lambda name, time, attributes: {"name": name, "timeUnixNano": time,
                                                "attributes": attributes},
                st.sampled_from(["gen_ai.evaluation.result", "exception", "other"]),
                st.integers(0, 2**64 - 1).map(str),
                st.lists(st.sampled_from([
                    {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 0.5}},
                    {"key": "gen_ai.evaluation.score.value", "value": {"intValue": "1"}},
                    {"key": "gen_ai.evaluation.score.label", "value": {"stringValue": "ok"}},
                    {"key": "exception.type", "value": {"stringValue": "ValueError"}},
                    {"key": "exception.message", "value": {"stringValue": "bad"}}]),
                    max_size=3)), max_size=2)),
            ("links", st.just([])), ("traceState", st.just("k=v")),
            ("droppedAttributesCount", st.just(0))):
        if draw(st.booleans()):
            span[field] = draw(values)
    for field in ("startTimeUnixNano", "endTimeUnixNano", "name", "kind", "status", "attributes"):
        if draw(st.integers(0, 9)) == 0:
            del span[field]
    return span


@st.composite
def _canonical_line(draw: Any) -> bytes:
    count = draw(st.integers(0, 4))
    spans = [draw(_canonical_span(i)) for i in range(count)]
    scope = draw(st.sampled_from([{"name": "s", "version": "1"}, {"name": "s"}, {}]))
    rs: dict[str, Any] = {"resource": {"attributes": draw(_canonical_attributes(4))},
                          "scopeSpans": [{"scope": scope, "spans": spans}]}
    if draw(st.integers(0, 4)) == 0:
        rs = {"scopeSpans": [{"spans": spans[:1]}, {"scope": scope, "spans": spans[1:]}]}
    return json.dumps({"resourceSpans": [rs] * draw(st.integers(1, 2))},
                      ensure_ascii=draw(st.booleans())).encode()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(lines=st.lists(_canonical_line(), min_size=1, max_size=4))
def test_canonical_spans_columnar_same_rows(tmp_path_factory: Any, lines: list[bytes]) -> None:
    """What the writers produce, every field and value type drawn: the columnar decoder takes
    every such stretch, and its rows are the codec's."""
    path = tmp_path_factory.mktemp("canon") / "otel_verl-canon.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    old = _decode([str(path)], legacy=True)
    new = _decode([str(path)], legacy=False)
    assert ARROW_STRETCHES[0] == 1
    assert new[0] == old[0]
    assert new[1:] == old[1:]


_GOOD = {"resourceSpans": [{"resource": {"attributes": [
    {"key": "service.name", "value": {"stringValue": "svc"}}]}, "scopeSpans": [{
        "scope": {"name": "s"}, "spans": [{
            "traceId": "ab" * 16, "spanId": "cd" * 8, "name": "n", "kind": 1,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "status": {},
            "attributes": [{"key": "rollout.step", "value": {"intValue": "3"}},
                           {"key": "k", "value": {"stringValue": "v"}}]}]}]}]}


def _good_line(**span: Any) -> bytes:
    line = copy.deepcopy(_GOOD)
    target = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    for key, value in span.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return json.dumps(line).encode()


_REFUSED = {
    "two values on one line": _good_line() + _good_line(),
    "a blank line": _good_line() + b"\n\n" + _good_line(),
    "a null field": _good_line().replace(b'"name": "n"', b'"name": null'),
    "intValue as a JSON number": _good_line().replace(b'"intValue": "3"', b'"intValue": 3'),
    "a 19-digit intValue": _good_line().replace(b'"intValue": "3"',
                                                b'"intValue": "1000000000000000000"'),
    "arrayValue": _good_line(attributes=[{"key": "a", "value": {"arrayValue": {"values": []}}}]),
    "two members": _good_line(attributes=[{"key": "a", "value": {"stringValue": "x",
                                                                  "intValue": "1"}}]),
    "no member": _good_line(attributes=[{"key": "a", "value": {}}]),
    "a repeated key": _good_line(attributes=[{"key": "a", "value": {"stringValue": "x"}},
                                             {"key": "a", "value": {"stringValue": "y"}}]),
    "a lone surrogate": _good_line(name="\ud800"),
    "NaN": _good_line().replace(b'"intValue": "3"', b'"doubleValue": NaN'),
    "a link": _good_line(links=[{"traceId": "ab" * 16, "spanId": "cd" * 8}]),
    "upper-case hex": _good_line(traceId="AB" * 16),
    "a zero span id": _good_line(spanId="0" * 16),
    "a base64 id": _good_line(spanId="q83vEjRWeJA="),
    "snake_case": _good_line(parent_span_id="ab" * 8),
    "a time as a number": _good_line().replace(b'"startTimeUnixNano": "1"',
                                               b'"startTimeUnixNano": 1'),
    "a time past int64": _good_line(startTimeUnixNano=str(2**63)),
    "an unknown kind": _good_line(kind=7),
    "an unknown status": _good_line(status={"code": 3}),
    "no resourceSpans": b'{"resource_spans": []}',
    "a top-level list": b"[]",
    "invalid UTF-8": _good_line().replace(b'"v"', b'"v\xff"'),
    "a UTF-8 surrogate": _good_line().replace(b'"v"', b'"\xed\xa0\x80"'),
    "a byte-order mark": b"\xef\xbb\xbf" + _good_line(),
    "a number as flags": _good_line().replace(b'"status": {}', b'"status": {}, "flags": 1e2'),
}

_TAKEN = {
    "an escaped field name": _good_line().replace(b'"name": "n"', b'"na\\u006de": "n"'),
    "escapes": _good_line().replace(b'"v"', b'"a\\/b\\u00E9\\ud83d\\ude00\x7f"'),
    "tabs between members": _good_line().replace(b'{"key": "k"', b'{\t"key":\t"k"'),
    "a -0 kind": _good_line().replace(b'"kind": 1', b'"kind": -0'),
    "CRLF": _good_line() + b"\r",
    "an empty line's worth of spans": b'{"resourceSpans": []}',
    "strings at the inline limit": _good_line(attributes=[
        {"key": "a", "value": {"stringValue": "x" * 1024}},
        {"key": "b", "value": {"stringValue": "x" * 1025}},
        {"key": "c", "value": {"stringValue": "é" * 1024}},
        {"key": "d", "value": {"stringValue": "é" * 1025}},
        {"key": "e", "value": {"intValue": "-100000000000000000"}}]),
}


@pytest.mark.parametrize("name", sorted(_TAKEN))
def test_columnar_takes_valid_variants(tmp_path: Path, name: str) -> None:
    """Valid JSON spellings orjson reads: the columnar decoder takes them, with the codec's
    rows."""
    path = tmp_path / "otel_verl-taken.jsonl"
    path.write_bytes(_good_line() + b"\n" + _TAKEN[name] + b"\n")
    old, new = _decode([str(path)], legacy=True), _decode([str(path)], legacy=False)
    assert ARROW_STRETCHES[0] == 1
    assert new == old


_HUGE = (2**64, 2**64 + 1, -(2**63) - 1, -(2**70), 10**40)


def _payload_line(i: int, content: str, attribute: str = "3") -> bytes:
    body = '{"messages": [{"role": "user", "content": ' + content + "}]}"
    answer = '{"messages": [{"role": "assistant", "content": [{"text": ' + content + "}]}]}"
    return _good_line(spanId=f"{i + 1:016x}", attributes=[
        {"key": "rollout.step", "value": {"intValue": "3"}},
        {"key": "k", "value": {"intValue": attribute}},
        {"key": "input.value", "value": {"stringValue": body}},
        {"key": "output.value", "value": {"stringValue": answer}}])


def test_payload_texts_are_the_stdlib_decoders(tmp_path: Path) -> None:
    """Payload bodies with integers beyond 64 bits (orjson reads them as floats), NaN, a float
    of their magnitude, nesting past orjson's guard: the viewer's text is the stdlib decoder's, on the columnar path (bodies) and the
    per-line one."""
    contents = [str(v) for v in _HUGE] + [f'{{"n": [{v}]}}' for v in _HUGE] + [
        "NaN", "1e19", '"plain"', "[" * 300 + "]" * 300, "[" * 800 + "]" * 800]
    columnar = tmp_path / "otel_verl-bodies.jsonl"
    columnar.write_bytes(b"".join(_payload_line(i, c) + b"\n" for i, c in enumerate(contents)))
    per_line = tmp_path / "otel_verl-attributes.jsonl"
    # a 19-digit intValue sends a stretch to the per-line decoder; one past 64 bits is a bad
    # span on every path
    per_line.write_bytes(b"".join(_payload_line(i, c, str(10**18 + i)) + b"\n"
                                  for i, c in enumerate(contents))
                         + _payload_line(99, "1", str(-(2**70))) + b"\n")
    _assert_same_rows([str(columnar)], min_rows=len(contents), arrow_stretches=1)
    _assert_same_rows([str(per_line)], min_rows=len(contents))
    for path in (columnar, per_line):
        rows = _decode([str(path)], legacy=False)[0]
        assert rows["text_prompt"][:len(_HUGE)] == [str(v) for v in _HUGE]
        assert rows["text_response"][:len(_HUGE)] == [str(v) for v in _HUGE]
    assert dict(rows["SpanAttributes"][0])["k"] == str(10**18)


@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_columnar_refuses_unusual_stretches(tmp_path: Path, name: str) -> None:
    """Each unusual shape sends the stretch to the per-line decoder, with nothing appended, and
    the rows are still the codec's."""
    data = _good_line() + b"\n" + _REFUSED[name] + b"\n"
    columns = Columns()
    assert add_stretch(columns, _good_line() + b"\n", 0, "s") == 1  # the clean line alone: taken
    columns = Columns()
    assert add_stretch(columns, data, 0, "s") is None
    assert len(columns) == 0 and not columns.tables
    path = tmp_path / "otel_verl-refused.jsonl"
    path.write_bytes(data)
    old, new = _decode([str(path)], legacy=True), _decode([str(path)], legacy=False)
    assert ARROW_STRETCHES[0] == 0
    assert new == old
