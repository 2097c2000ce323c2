"""FileSpanExporter: OTLP/JSON lines the collector's file exporter would write, one file per process."""

from __future__ import annotations

import base64
import json
import logging
import multiprocessing
import os
import socket
import threading

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr, semconv
from otel_verl._errors import RateLimitedWarning
from otel_verl.exporters._file_exporter import (
    DEFAULT_TRACE_DIR,
    ENV_TRACE_DIR,
    FileSpanExporter,
    encode_line,
    encode_request,
    resolve_trace_dir,
)

ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _provider(exporter, **resource):
    provider = TracerProvider(resource=Resource.create({"service.name": "test", **resource}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _lines(path):
    with open(path, "rb") as f:
        return f.read().splitlines()


def _files(directory):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory))


def _base64_ids_to_hex(obj):
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON writes ids as hex."""
    if isinstance(obj, dict):
        return {
            k: base64.b64decode(v).hex() if k in ID_FIELDS else _base64_ids_to_hex(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_base64_ids_to_hex(v) for v in obj]
    return obj


def _rich_spans():
    """Finished spans exercising every field the encoder writes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "svc", "n": 3}, schema_url="https://r/1")
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope.a", "1.2", schema_url="https://s/1", attributes={"sa": 1})
    other = provider.get_tracer("scope.b")
    remote = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("k", "x")]),
    )
    attrs = {
        "s": "text é ✓", "empty": "", "i": -(2**63), "big": 2**63 - 1, "f": 0.25, "whole": 2.0,
        "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "b": False,
        "ls": ["a", "b"], "li": [1, 2], "lf": [0.5], "lb": [True, False], "le": [],
        semconv.ROLLOUT_STEP: 3,
    }
    with tracer.start_as_current_span(
        "root", context=trace_api.set_span_in_context(trace_api.NonRecordingSpan(remote)),
        kind=SpanKind.SERVER, attributes=attrs, links=[Link(remote, {"why": "x"})],
    ) as root:
        root.add_event("ev", {"k": 1.5, "l": ["x"]})
        root.add_event("bare")
        for kind in (SpanKind.INTERNAL, SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER):
            with other.start_as_current_span(f"child-{kind.name}", kind=kind):
                pass
        with tracer.start_as_current_span("failing") as failing:
            failing.set_status(Status(StatusCode.ERROR, "it broke"))
            failing.set_attribute("dict", {"x": [1, {"y": None}], "z": "w"})
            failing.set_attribute("bytes", b"\x00\xff")
        with tracer.start_as_current_span("ok") as ok:
            ok.set_status(Status(StatusCode.OK))
    spans = memory.get_finished_spans()
    provider.shutdown()
    return spans


def test_encoder_writes_the_same_message_as_encode_spans_plus_json_format():
    spans = _rich_spans()
    expected = _base64_ids_to_hex(
        json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    )
    ours = encode_request(spans)
    assert json.loads(encode_line(spans)) == ours
    # one deliberate difference: encode_spans leaves out Link.trace_state, OTLP field 3; we keep it
    links = [
        link
        for rs in ours["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]
        for link in span.get("links", ())
    ]
    assert [link.pop("traceState") for link in links] == ["vendor=v1,k=x"]
    assert ours == expected


def test_line_is_otlp_json_hex_ids_int_enums_int64_strings():
    spans = _rich_spans()
    line = json.loads(encode_line(spans))
    root = next(
        s for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
        if s["name"] == "root"
    )
    assert root["traceId"] == f"{0xABC:032x}" and root["parentSpanId"] == f"{0xDEF:016x}"
    assert root["spanId"] == f"{spans[-1].context.span_id:016x}"
    assert root["kind"] == 2  # SPAN_KIND_SERVER
    assert root["flags"] == 0x300  # has-is-remote | is-remote
    assert root["traceState"] == "vendor=v1,k=x"
    assert isinstance(root["startTimeUnixNano"], str) and int(root["startTimeUnixNano"]) > 0
    attrs = {kv["key"]: kv["value"] for kv in root["attributes"]}
    assert attrs["i"] == {"intValue": str(-(2**63))}
    assert attrs["nan"] == {"doubleValue": "NaN"} and attrs["ninf"] == {"doubleValue": "-Infinity"}
    assert attrs["le"] == {"arrayValue": {}}
    failing = next(
        s for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
        if s["name"] == "failing"
    )
    assert failing["status"] == {"message": "it broke", "code": 2}


def test_every_line_loads_with_the_protobuf_json_parser(tmp_path):
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("a") as a:
        a.set_attribute(semconv.INPUT_VALUE, json.dumps({"messages": ["hi\n\"quoted\""] * 10}))
        with tracer.start_as_current_span("b"):
            pass
    provider.shutdown()
    lines = _lines(exporter.path)
    assert len(lines) == 2  # SimpleSpanProcessor: one export (one line) per span
    names = []
    for line in lines:
        request = json_format.Parse(line, ExportTraceServiceRequest())
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    names.append(span.name)
                    assert span.kind == span.SPAN_KIND_INTERNAL
                    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    assert names == ["b", "a"]
    # protobuf's parser takes the hex ids as base64 (OTLP/JSON's documented deviation), so the
    # parsed bytes re-encoded as base64 give back exactly the hex text in the file
    raw = json.loads(lines[0])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    parsed = json_format.Parse(lines[0], ExportTraceServiceRequest())
    span = parsed.resource_spans[0].scope_spans[0].spans[0]
    assert base64.b64encode(span.trace_id).decode() == raw["traceId"]


def test_file_is_named_by_host_pid_and_start_time_and_created_on_first_export(tmp_path):
    directory = tmp_path / "nested" / "store"
    exporter = FileSpanExporter(directory)
    assert exporter.directory == str(directory)
    assert exporter.path is None and not directory.exists()  # nothing until the first span
    provider = _provider(exporter)
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    name = os.path.basename(exporter.path)
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())
    assert name.startswith(f"otel_verl-{host}-{os.getpid()}-") and name.endswith("Z.jsonl")
    assert _files(directory) == [exporter.path]
    # a second exporter in the same process and second never shares the file
    second = FileSpanExporter(directory)
    second.export(exporter_spans := [_rich_spans()[0]])
    assert second.path != exporter.path and len(_files(directory)) == 2
    assert len(_lines(second.path)) == 1 and exporter_spans


@pytest.mark.parametrize(
    ("argument", "env", "expected"),
    [
        ("explicit", "from-env", "explicit"),
        (None, "from-env", "from-env"),
        (None, "", DEFAULT_TRACE_DIR),
        (None, None, DEFAULT_TRACE_DIR),
    ],
)
def test_directory_precedence(tmp_path, monkeypatch, argument, env, expected):
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv(ENV_TRACE_DIR, raising=False)
    else:
        monkeypatch.setenv(ENV_TRACE_DIR, env)
    assert resolve_trace_dir(argument) == str(tmp_path / expected)
    assert FileSpanExporter(argument).directory == str(tmp_path / expected)


CHILD_MODULE = """
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_verl.exporters._file_exporter import FileSpanExporter


def write_spans(directory, label, count):
    provider = TracerProvider(resource=Resource.create({"service.name": label}))
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(directory)))
    tracer = provider.get_tracer("child")
    for i in range(count):
        with tracer.start_as_current_span(f"{label}-{i}"):
            pass
    provider.shutdown()
"""


@pytest.fixture
def child_module(tmp_path_factory, monkeypatch):
    """A module a spawned child can import (pytest's importlib mode makes test modules unimportable
    by name); spawn hands the parent's sys.path to the child."""
    where = tmp_path_factory.mktemp("child_module")
    (where / "otel_verl_file_child.py").write_text(CHILD_MODULE)
    monkeypatch.syspath_prepend(str(where))
    import otel_verl_file_child

    return otel_verl_file_child


def _export_in_forked_child(exporter: FileSpanExporter, label: str, count: int) -> None:
    """Runs in a forked child: keeps using the exporter object the parent made."""
    provider = _provider(exporter)
    tracer = provider.get_tracer("child")
    for i in range(count):
        with tracer.start_as_current_span(f"{label}-{i}"):
            pass
    provider.force_flush()


def _span_names(path):
    return [
        span["name"]
        for line in _lines(path)
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_forked_child_writes_its_own_file(tmp_path):
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    with provider.get_tracer("parent").start_as_current_span("parent-before"):
        pass
    parent_file = exporter.path
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_export_in_forked_child, args=(exporter, "forked", 5))
    child.start()
    with provider.get_tracer("parent").start_as_current_span("parent-during"):
        pass
    child.join(30)
    assert child.exitcode == 0
    with provider.get_tracer("parent").start_as_current_span("parent-after"):
        pass
    files = _files(tmp_path)
    assert len(files) == 2 and parent_file in files
    child_file = next(f for f in files if f != parent_file)
    assert f"-{child.pid}-" in os.path.basename(child_file)
    assert _span_names(parent_file) == ["parent-before", "parent-during", "parent-after"]
    assert _span_names(child_file) == [f"forked-{i}" for i in range(5)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_processes_write_separate_files(tmp_path, method, child_module):
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} unavailable on this platform")
    ctx = multiprocessing.get_context(method)
    children = [
        ctx.Process(target=child_module.write_spans, args=(str(tmp_path), f"p{n}", 20))
        for n in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    files = _files(tmp_path)
    assert len(files) == 2
    by_pid = {int(os.path.basename(f).split("-")[-2]): f for f in files}
    assert set(by_pid) == {c.pid for c in children}
    for n, child in enumerate(children):
        assert _span_names(by_pid[child.pid]) == [f"p{n}-{i}" for i in range(20)]


def test_concurrent_exports_never_interleave_lines(tmp_path):
    exporter = FileSpanExporter(tmp_path)
    spans = _rich_spans()
    threads = [
        threading.Thread(target=lambda: [exporter.export(spans) for _ in range(50)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = _lines(exporter.path)
    assert len(lines) == 200
    for line in lines:
        assert json.loads(line) == encode_request(spans)
    assert exporter.exported_spans == 200 * len(spans)


def test_export_never_raises_and_counts_failures(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    exporter = FileSpanExporter(blocker / "store")
    spans = _rich_spans()
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.failed_spans == 2 * len(spans) and exporter.exported_spans == 0
    assert sum("could not write" in r.getMessage() for r in caplog.records) == 1  # rate-limited
    assert sum(bool(r.exc_info) for r in caplog.records) == 1  # one traceback, not a flood
    assert exporter.stats()["file_warnings_suppressed"] == 1


def _unwritable(kind, tmp_path, monkeypatch):
    """A trace dir that cannot be written: below a regular file (NotADirectoryError), or one
    whose writes raise PermissionError (what a read-only directory gives a non-root user)."""
    if kind == "parent-is-a-file":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        return blocker / "store"
    from otel_verl.exporters import _io

    def denied(fd, data):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_io, "write", denied)
    return tmp_path / "store"


@pytest.mark.parametrize("kind", ["parent-is-a-file", "permission-denied"])
def test_unwritable_trace_dir_warns_once_per_interval_and_counts(kind, tmp_path, monkeypatch,
                                                                 caplog):
    """800 spans through the file backend into a dir that cannot be written: one warning line
    (with its traceback) and a summary at shutdown, not a line per batch; stats() counts."""
    trace_dir = _unwritable(kind, tmp_path, monkeypatch)
    RolloutTraceConfig.init("p", "e", "file", trace_dir=str(trace_dir), schedule_delay_s=0.05,
                            max_export_batch_size=50)
    tracer = get_tracer()
    with caplog.at_level(logging.WARNING):
        for step in range(8):
            with rollout_trace_attr(step=step, sample_index=0, rollout_n=0, name="t"):
                for i in range(99):
                    tracer.start_span(f"s{i}").end()
            RolloutTraceConfig.flush(5)
        stats = RolloutTraceConfig.stats()
        RolloutTraceConfig.shutdown(timeout_s=5)
    lines = [r for r in caplog.records if r.name == "otel_verl.exporters._file_exporter"]
    assert stats["file_write_failed"] == 800 and stats["export_failed"] == 800
    assert stats["file_warnings"] == 1
    assert stats["file_warnings_suppressed"] >= 15  # 16+ batches of at most 50 spans failed
    assert len(lines) == 2, [r.getMessage() for r in lines]  # the first, the shutdown summary
    assert lines[0].exc_info and "could not write" in lines[0].getMessage()
    assert f"{stats['file_warnings_suppressed']} more warning(s)" in lines[1].getMessage()
    assert "800 span(s) in all" in lines[1].getMessage()


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.floats(min_value=0.0, max_value=30.0), min_size=1, max_size=200),
       interval=st.sampled_from([0.0, 1.0, 10.0, 60.0]))
def test_rate_limited_warning_bounds_lines_and_counts_every_one(gaps, interval):
    now = [0.0]
    logger = logging.getLogger("otel_verl.test_rate_limit")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.propagate = False
    try:
        warning = RateLimitedWarning(logger, interval, clock=lambda: now[0])
        for gap in gaps:
            now[0] += gap
            warning.warn("failed %s", "x")
        warning.summary("failures")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert warning.logged + warning.suppressed == len(gaps)
    assert sum(r.getMessage().startswith("failed x") for r in records) == warning.logged
    if interval:  # two lines are at least an interval apart
        assert warning.logged <= 1 + now[0] / interval
    else:
        assert warning.logged == len(gaps)
    # every suppressed warning is said once: in the next line or in the summary
    said = 0
    for record in records:
        text = record.getMessage()
        if "more like it" in text:
            said += int(text.split("(")[1].split(" ")[0])
        elif text.startswith("otel_verl: "):
            said += int(text.split(" ")[1])
    assert said == warning.suppressed


def test_unencodable_attribute_is_dropped_not_the_span(tmp_path, caplog):
    memory = InMemorySpanExporter()
    provider = _provider(memory)
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("huge", 2**70)  # does not fit OTLP's int64
        span.set_attribute("keep", 1)
        span.set_attribute("surrogate", "bad \ud800 text")
    exporter = FileSpanExporter(tmp_path)
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS
    (line,) = _lines(exporter.path)
    request = json_format.Parse(line, ExportTraceServiceRequest())
    attrs = {kv.key: kv.value for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes}
    assert "huge" not in attrs and attrs["keep"].int_value == 1
    assert attrs["surrogate"].string_value == "bad ? text"
    assert any("huge" in r.getMessage() for r in caplog.records)


def test_lifecycle_shutdown_idempotent_flush_returns_bool(tmp_path, caplog):
    exporter = FileSpanExporter(tmp_path)
    spans = _rich_spans()
    assert exporter.force_flush() is True  # nothing written yet
    assert exporter.export([]) is SpanExportResult.SUCCESS and exporter.path is None
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.force_flush(1000) is True
    exporter.shutdown()
    exporter.shutdown()
    with caplog.at_level(logging.WARNING, logger="otel_verl"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.FAILURE
    assert sum("after shutdown" in r.getMessage() for r in caplog.records) == 1
    assert len(_lines(exporter.path)) == 1


def test_ints_beyond_4300_digits_drop_the_attribute_not_the_batch(tmp_path, caplog):
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    tracer.start_span("huge", attributes={"big": 10**5000, "ok": 1, "neg": -(10**5000)}).end()
    provider.shutdown()
    (line,) = _lines(exporter.path)
    (span,) = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [a["key"] for a in span["attributes"]] == ["ok"]
    assert exporter.failed_spans == 0 and "int64" in caplog.text


def test_a_partial_write_on_a_full_disk_does_not_corrupt_the_next_line(tmp_path, monkeypatch):
    import errno

    from otel_verl.exporters import _file_exporter, _io
    from otel_verl.store import ReadStats, read_spans

    real = _io.write
    mode = {"fail": False, "truncate_fails": False}

    def flaky(fd, data):
        if mode["fail"]:
            real(fd, data[: max(1, len(data) // 3)])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    real_ftruncate = os.ftruncate

    def ftruncate(fd, size):
        if mode["truncate_fails"]:
            raise OSError(errno.EIO, "cannot truncate")
        return real_ftruncate(fd, size)

    monkeypatch.setattr(_io, "write", flaky)
    monkeypatch.setattr(_file_exporter.os, "ftruncate", ftruncate)
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    tracer.start_span("before").end()
    mode["fail"] = True
    tracer.start_span("lost-cut-back").end()       # the partial line is cut back
    mode["truncate_fails"] = True
    tracer.start_span("lost-torn").end()            # cannot cut back: the line stays torn
    mode["fail"] = mode["truncate_fails"] = False
    tracer.start_span("after").end()                # must start on a line of its own
    provider.shutdown()
    stats = ReadStats()
    names = [s["name"] for s in read_spans(tmp_path, stats=stats, warn=False)]
    assert names == ["before", "after"], open(exporter.path, "rb").read()
    assert stats.bad_lines == 1 and exporter.failed_spans == 2
