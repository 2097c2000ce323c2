"""otel_verl.store: read the local store back, filter, group into trajectories."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_verl import semconv
from otel_verl.exporters._file_exporter import FileSpanExporter
from otel_verl.store import (
    ReadStats,
    filter_spans,
    filter_trajectories,
    group_trajectories,
    list_files,
    read_spans,
)


class SequentialIds(IdGenerator):
    """Deterministic ids: trace ids 0x100, 0x200, ...; span ids 1, 2, 3, ..."""

    def __init__(self) -> None:
        self.trace = 0
        self.span = 0

    def generate_trace_id(self) -> int:
        self.trace += 0x100
        return self.trace

    def generate_span_id(self) -> int:
        self.span += 1
        return self.span


def _provider(exporter, ids=None, **resource):
    provider = TracerProvider(
        resource=Resource.create({"service.name": "test", **resource}), id_generator=ids
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _trajectory_attrs(step, sample, rollout=0, validate=False, experiment="exp"):
    return {
        semconv.ROLLOUT_STEP: step,
        semconv.ROLLOUT_SAMPLE_INDEX: sample,
        semconv.ROLLOUT_ROLLOUT_N: rollout,
        semconv.ROLLOUT_VALIDATE: validate,
        semconv.ROLLOUT_EXPERIMENT_NAME: experiment,
    }


def _write_trajectory(tracer, step, sample, rollout=0, validate=False, turns=2, fail=False):
    attrs = _trajectory_attrs(step, sample, rollout, validate)
    with tracer.start_as_current_span(
        "rollout_trace", attributes={**attrs, semconv.OTEL_VERL_TRAJECTORY: True}
    ) as root:
        with tracer.start_as_current_span(
            "AgentLoop.run", attributes={**attrs, semconv.OTEL_VERL_TRAJECTORY_CHILD: True}
        ):
            for turn in range(turns):
                with tracer.start_as_current_span("AgentLoop.generate", attributes=attrs) as gen:
                    gen.set_attribute(semconv.OUTPUT_VALUE, json.dumps({"turn": turn}))
            if fail:
                with tracer.start_as_current_span("Tool.execute", attributes=attrs) as tool:
                    tool.record_exception(ValueError("tool broke"))
                    tool.set_status(Status(StatusCode.ERROR, "ValueError: tool broke"))
        root.set_attribute(semconv.ROLLOUT_REWARD, float(sample))
        root.set_attribute(semconv.ROLLOUT_NUM_TURNS, turns)
        return root.get_span_context().trace_id


# --- round trip ---------------------------------------------------------------------------------


def test_round_trip_preserves_every_field(tmp_path):
    memory = InMemorySpanExporter()
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter, project="p", num=7)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my.scope", "9.9")
    attrs = {
        "str": "héllo ✓ \"quoted\"\n", "empty": "", "int": 42, "neg": -(2**63), "float": 0.125,
        "nan": float("nan"), "inf": float("-inf"), "true": True, "false": False,
        "strs": ["a", "b"], "ints": [1, -2], "floats": [0.5, 1.5], "bools": [True, False],
        "none_list": [], semconv.ROLLOUT_STEP: 3,
    }
    with tracer.start_as_current_span("root", kind=SpanKind.CLIENT, attributes=attrs) as root:
        root.add_event("gen_ai.evaluation.result", {semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.5})
        root.set_attribute("dict", {"k": [1, "x"], "n": None})
        root.set_attribute("bytes", b"\x00\x01\xff")
        with tracer.start_as_current_span("child", links=[Link(root.get_span_context(), {"l": 1})]):
            pass
        with tracer.start_as_current_span("failed") as failed:
            failed.set_status(Status(StatusCode.ERROR, "nope"))
    provider.shutdown()

    stats = ReadStats()
    got = {s["name"]: s for s in read_spans(tmp_path, stats=stats)}
    sdk = {s.name: s for s in memory.get_finished_spans()}
    assert set(got) == {"root", "child", "failed"}
    assert (stats.files, stats.lines, stats.spans, stats.skipped) == (1, 3, 3, 0)
    for name, span in sdk.items():
        d = got[name]
        assert d["trace_id"] == f"{span.context.trace_id:032x}"
        assert d["span_id"] == f"{span.context.span_id:016x}"
        assert d["parent_span_id"] == (f"{span.parent.span_id:016x}" if span.parent else None)
        assert (d["start_ns"], d["end_ns"]) == (span.start_time, span.end_time)
        assert d["resource"] == dict(span.resource.attributes)
        assert d["scope"] == {"name": "my.scope", "version": "9.9"}
    root = got["root"]
    assert root["kind"] == "CLIENT" and got["child"]["kind"] == "INTERNAL"
    a = root["attributes"]
    for key in ("str", "empty", "int", "neg", "float", "true", "false", semconv.ROLLOUT_STEP):
        assert a[key] == attrs[key] and type(a[key]) is type(attrs[key]), key
    assert math.isnan(a["nan"]) and a["inf"] == float("-inf")
    assert a["strs"] == ["a", "b"] and a["ints"] == [1, -2] and a["floats"] == [0.5, 1.5]
    assert a["bools"] == [True, False] and a["none_list"] == []
    assert a["dict"] == {"k": [1, "x"], "n": None} and a["bytes"] == b"\x00\x01\xff"
    assert root["events"] == [{
        "name": "gen_ai.evaluation.result",
        "time_ns": sdk["root"].events[0].timestamp,
        "attributes": {semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.5},
    }]
    assert root["status"] == {"code": "UNSET", "message": ""}
    assert got["failed"]["status"] == {"code": "ERROR", "message": "nope"}
    assert got["child"]["links"] == [
        {"trace_id": root["trace_id"], "span_id": root["span_id"], "attributes": {"l": 1}}
    ]
    assert got["root"]["resource"]["project"] == "p" and got["root"]["resource"]["num"] == 7


def test_reads_plain_proto3_json_too(tmp_path):
    """protobuf's own JSON (base64 ids, enum names) and the collector's format decode alike."""
    memory = InMemorySpanExporter()
    provider = _provider(memory)
    with provider.get_tracer("t").start_as_current_span("a", kind=SpanKind.SERVER) as a:
        a.set_attribute("n", 5)
        with provider.get_tracer("t").start_as_current_span("b") as b:
            b.set_status(Status(StatusCode.ERROR, "x"))
    spans = memory.get_finished_spans()
    (tmp_path / "proto.json").write_text(json_format.MessageToJson(encode_spans(spans), indent=None) + "\n")
    FileSpanExporter(tmp_path / "ours").export(spans)
    plain = list(read_spans(tmp_path / "proto.json"))
    ours = list(read_spans(tmp_path / "ours"))
    assert plain == ours
    assert [s["kind"] for s in plain] == ["INTERNAL", "SERVER"]
    assert plain[0]["status"]["code"] == "ERROR" and plain[1]["attributes"] == {"n": 5}


# --- damaged files ------------------------------------------------------------------------------


def _store_with_two_lines(tmp_path):
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    for name in ("first", "second"):
        with tracer.start_as_current_span(name):
            pass
    provider.shutdown()
    return exporter.path


def test_truncated_last_line_is_skipped_and_counted(tmp_path, caplog):
    path = _store_with_two_lines(tmp_path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) - 40])  # a writer that died halfway through a line
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="otel_verl.store"):
        names = [s["name"] for s in read_spans(tmp_path, stats=stats)]
    assert names == ["first"]
    assert (stats.truncated_lines, stats.bad_lines, stats.spans) == (1, 0, 1)
    assert "truncated last line" in stats.problems[0]
    (record,) = [r for r in caplog.records if r.name == "otel_verl.store"]
    assert "skipped 1 truncated line(s)" in record.getMessage()


def test_bad_lines_and_bad_spans_never_stop_the_read(tmp_path):
    good = _store_with_two_lines(tmp_path / "a")
    lines = Path(good).read_bytes().splitlines(keepends=True)
    bad_span = json.loads(lines[1])
    bad_span["resourceSpans"][0]["scopeSpans"][0]["spans"].append({"name": "no ids"})
    with open(tmp_path / "a" / "mixed.jsonl", "wb") as f:
        f.write(lines[0])
        f.write(b"{not json\n")
        f.write(b'{"something": "else"}\n')
        f.write(b"\n")
        f.write(b"\xff\xfe binary junk\n")
        f.write(json.dumps(bad_span).encode() + b"\n")
    (tmp_path / "a" / "notes.txt").write_text("ignored: not a store file")
    stats = ReadStats()
    names = [s["name"] for s in read_spans(tmp_path, stats=stats, warn=False)]
    assert sorted(names) == ["first", "first", "second", "second"]
    assert (stats.files, stats.bad_lines, stats.bad_spans, stats.truncated_lines) == (2, 3, 1, 0)


def test_list_files_and_missing_paths(tmp_path):
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "b.jsonl").write_text("")
    (tmp_path / "a.json").write_text("")
    (tmp_path / "c.log").write_text("")
    assert list_files(tmp_path) == [str(tmp_path / "a.json"), str(tmp_path / "n1" / "b.jsonl")]
    assert list_files(tmp_path / "c.log") == [str(tmp_path / "c.log")]  # a file is taken as is
    with pytest.raises(FileNotFoundError):
        read_spans(tmp_path / "missing")  # raised at the call, not at the first next()


def test_progress_callback_sees_every_byte(tmp_path):
    path = _store_with_two_lines(tmp_path)
    seen = []
    list(read_spans(path, progress=seen.append))
    assert sum(seen) == os.path.getsize(path) and len(seen) == 2


# --- filtering and grouping ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    """2 steps x 2 samples x 2 rollouts of training, 1 validation trajectory, 1 failing one."""
    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter, SequentialIds())
    tracer = provider.get_tracer("otel_verl")
    for step in (1, 2):
        for sample in (0, 1):
            for rollout in (0, 1):
                _write_trajectory(tracer, step, sample, rollout)
    _write_trajectory(tracer, 2, 5, validate=True, turns=1)
    _write_trajectory(tracer, 3, 0, fail=True)
    provider.shutdown()
    return tmp_path


def test_filter_spans_by_each_criterion(store):
    spans = list(read_spans(store))
    assert len(spans) == 8 * 4 + 3 + 5
    by_step = list(filter_spans(spans, step=1))
    assert len(by_step) == 16 and all(s["attributes"][semconv.ROLLOUT_STEP] == 1 for s in by_step)
    assert len(list(filter_spans(spans, step=2, sample_index=1, rollout_n=0))) == 4
    assert len(list(filter_spans(spans, validate=True))) == 3
    assert len(list(filter_spans(spans, validate=False))) == len(spans) - 3
    assert len(list(filter_spans(spans, experiment="exp"))) == len(spans)
    assert list(filter_spans(spans, experiment="other")) == []
    assert list(filter_spans(spans)) == spans
    # 0 is a real criterion (not "any"), and False never matches 0
    assert len(list(filter_spans(spans, sample_index=0))) == 4 * 4 + 5
    assert list(filter_spans(spans, rollout_n=False)) == []


def test_filter_spans_falls_back_to_the_resource(tmp_path):
    memory = InMemorySpanExporter()
    provider = _provider(FileSpanExporter(tmp_path), **{semconv.ROLLOUT_EXPERIMENT_NAME: "res-exp"})
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("no attrs"):
        pass
    provider.shutdown()
    spans = list(read_spans(tmp_path))
    assert len(list(filter_spans(spans, experiment="res-exp"))) == 1
    assert list(filter_spans(spans, step=1)) == []  # a missing key never matches


def test_group_trajectories_builds_each_tree(store):
    trajectories = group_trajectories(read_spans(store))
    assert len(trajectories) == 10
    assert [(t.step, t.sample_index, t.rollout_n) for t in trajectories[:8]] == [
        (step, sample, rollout) for step in (1, 2) for sample in (0, 1) for rollout in (0, 1)
    ]
    first = trajectories[0]
    assert first.trace_id == f"{0x100:032x}" and first.root["name"] == "rollout_trace"
    assert [(depth, span["name"]) for depth, span in first.walk()] == [
        (0, "rollout_trace"), (1, "AgentLoop.run"), (2, "AgentLoop.generate"),
        (2, "AgentLoop.generate"),
    ]
    assert [json.loads(n.span["attributes"][semconv.OUTPUT_VALUE])["turn"]
            for n in first.tree[0].children[0].children] == [0, 1]  # children by start time
    assert first.num_turns == 2 and first.status == "ok" and first.validate is False
    assert first.duration_ns == first.root["end_ns"] - first.root["start_ns"] > 0
    val = trajectories[8]
    assert (val.validate, val.sample_index, val.reward, val.num_turns) == (True, 5, 5.0, 1)
    failing = trajectories[9]
    assert failing.status == "error" and [s["name"] for s in failing.errors] == ["Tool.execute"]
    summary = failing.summary()
    assert summary["errors"] == 1 and summary["spans"] == 5 and summary["step"] == 3
    json.dumps(summary)  # JSON-ready


def test_filter_trajectories(store):
    trajectories = group_trajectories(read_spans(store))
    assert len(filter_trajectories(trajectories, step=2)) == 5
    assert len(filter_trajectories(trajectories, step=2, validate=False)) == 4
    assert len(filter_trajectories(trajectories, sample_index=1, rollout_n=1)) == 2
    assert filter_trajectories(trajectories, experiment="nope") == []
    assert filter_trajectories(trajectories) == trajectories


def test_grouping_across_processes_steps_partial_and_duplicates(tmp_path):
    """Spans from another process join their trajectory; a step span holding two trajectories
    yields two; children of a trajectory span that never ended form a partial trajectory."""
    ids = SequentialIds()
    trainer = _provider(FileSpanExporter(tmp_path / "trainer"), ids, **{"process.pid": 1})
    engine = _provider(FileSpanExporter(tmp_path / "engine"), ids, **{"process.pid": 2})
    tracer = trainer.get_tracer("otel_verl")
    with tracer.start_as_current_span("training_step"):
        for sample in (0, 1):
            with tracer.start_as_current_span(
                "rollout_trace",
                attributes={**_trajectory_attrs(1, sample), semconv.OTEL_VERL_TRAJECTORY: True},
            ):
                with tracer.start_as_current_span("generate") as gen:
                    # the engine continues the trace from a traceparent: no rollout.* attributes
                    ctx = trace_api.set_span_in_context(
                        trace_api.NonRecordingSpan(gen.get_span_context()))
                    with engine.get_tracer("vllm").start_as_current_span("llm_request", context=ctx):
                        pass
        # a trajectory whose own span was never exported (the worker crashed before it ended)
        lost = tracer.start_span("rollout_trace")
        ctx = trace_api.set_span_in_context(lost)
        with tracer.start_as_current_span("orphan", context=ctx, attributes=_trajectory_attrs(1, 7)):
            pass
    trainer.shutdown()
    engine.shutdown()

    spans = list(read_spans(tmp_path))
    trajectories = group_trajectories(spans + spans[:3])  # duplicates are kept once
    assert len(trajectories) == 3
    full = [t for t in trajectories if t.root is not None]
    assert [t.sample_index for t in full] == [0, 1]
    for t in full:
        assert [(d, s["name"]) for d, s in t.walk()] == [
            (0, "rollout_trace"), (1, "generate"), (2, "llm_request")
        ]
        assert t.spans[-1]["resource"]["process.pid"] == 2  # joined from the engine's file
    partial = trajectories[2]
    assert partial.root is None and partial.status == "partial"
    assert [s["name"] for s in partial.spans] == ["orphan"] and partial.sample_index == 7
    assert len({t.trace_id for t in trajectories}) == 1  # all in the step's trace


def test_trace_without_trajectory_span_is_one_trajectory(tmp_path):
    provider = _provider(FileSpanExporter(tmp_path), SequentialIds())
    tracer = provider.get_tracer("plain")
    with tracer.start_as_current_span("request"):
        with tracer.start_as_current_span("db"):
            pass
    provider.shutdown()
    (t,) = group_trajectories(read_spans(tmp_path))
    assert t.root is None and t.name == "request" and t.status == "partial"
    assert [(d, s["name"]) for d, s in t.walk()] == [(0, "request"), (1, "db")]


def test_reward_falls_back_to_the_evaluation_event(tmp_path):
    provider = _provider(FileSpanExporter(tmp_path))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("rollout_trace", attributes={semconv.OTEL_VERL_TRAJECTORY: True}):
        with tracer.start_as_current_span("reward") as reward:
            reward.add_event(semconv.GEN_AI_EVALUATION_RESULT,
                             {semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.75})
    provider.shutdown()
    (t,) = group_trajectories(read_spans(tmp_path))
    assert t.reward == 0.75 and t.status == "ok"


def test_spans_from_otlp_json_reads_the_remote_parent_flag():
    from otel_verl.store import spans_from_otlp_json

    def one(flags):
        span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "parentSpanId": "ef" * 8, "name": "s"}
        if flags is not None:
            span["flags"] = flags
        (got,) = spans_from_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
        return got["parent_is_remote"]

    assert one(0x300) is True
    assert one(0x100) is False
    assert one(None) is None


@pytest.mark.parametrize("line", [
    b"[1, 2, 3]\n",
    b'"a string"\n',
    b"42\n",
    b"null\n",
    b'{"resourceSpans": 5}\n',
    b'{"resourceSpans": [5, "x", null, {"scopeSpans": 7}, {"scopeSpans": [3, {"spans": 9}]}]}\n',
    b"[" * 200_000 + b"]" * 200_000 + b"\n",
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n",
])
def test_any_line_is_survived_and_said(tmp_path, line, capsys):
    """Valid JSON that is not an object, shapes that are not OTLP, nesting deeper than the
    parser's recursion limit: skipped, counted and reported, by the library and by the CLI."""
    good = Path(_store_with_two_lines(tmp_path / "s"))
    with open(good, "ab") as handle:
        handle.write(line)
    stats = ReadStats()
    names = [s["name"] for s in read_spans(tmp_path / "s", stats=stats, warn=False)]
    assert sorted(names) == ["first", "second"]
    assert stats.skipped >= 1 and stats.problems

    from otel_verl.cli import main

    assert main(["traces", "list", "--dir", str(tmp_path / "s"), "--no-progress"]) == 0
    assert "skipped" in capsys.readouterr().err


def test_deeply_nested_attribute_values_are_a_bad_span_not_a_crash(tmp_path):
    depth = 5000
    value = '{"arrayValue":{"values":[' * depth + '{"stringValue":"leaf"}' + "]}}" * depth
    line = ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + "1" * 32
            + '","spanId":"' + "2" * 16 + '","name":"deep","attributes":[{"key":"k","value":'
            + value + "}]}]}]}]}")
    (tmp_path / "deep.jsonl").write_text(line + "\n")
    stats = ReadStats()
    assert list(read_spans(tmp_path, stats=stats, warn=False)) == []
    assert stats.skipped == 1  # a bad line (json's own limit) or a bad span (the decoder's)
    from otel_verl._otlp_json import iter_spans

    nested: dict = {"stringValue": "leaf"}
    for _ in range(3000):  # past the decoder's recursion limit, built without the parser
        nested = {"arrayValue": {"values": [nested]}}
    bad: list[str] = []
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "attributes": [{"key": "k", "value": nested}]}
    assert list(iter_spans([{"scopeSpans": [{"spans": [span]}]}], bad.append)) == []
    assert len(bad) == 1 and "RecursionError" in bad[0]


def test_replayed_child_spans_keep_their_local_parent_flag(tmp_path):
    from otel_verl._otlp_json import readable_span

    exporter = FileSpanExporter(tmp_path)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent"):
        tracer.start_span("child").end()
    provider.shutdown()
    child = next(s for s in read_spans(tmp_path) if s["name"] == "child")
    assert child["parent_is_remote"] is False
    rebuilt = readable_span(child)
    assert rebuilt.parent is not None and rebuilt.parent.is_remote is False
    remote = dict(child, parent_is_remote=True)
    assert readable_span(remote).parent.is_remote is True
