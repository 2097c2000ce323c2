"""Detectors (otel_verl.exporters._detect): each built-in one on records that show its failure and
on ones that do not; the processor's worker thread flags the trajectory span and passes every
span on; your own detector; one that raises has no opinion; hostile spans never break it; rewards
with components and per-turn rewards as GenAI evaluation results (span events and log records).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_verl
from otel_verl import _evaluations, semconv
from otel_verl.exporters import _detect
from otel_verl.exporters._detect import (
    DETECTORS,
    Evaluation,
    FlaggingProcessor,
    ToolCall,
    TrajectoryRecord,
    Turn,
    register_detector,
)
from otel_verl.testing import capture_spans


def _record(**fields) -> TrajectoryRecord:
    attributes = fields.pop("attributes", {})
    return TrajectoryRecord(1, attributes, **fields)


def _tools(*specs) -> list[ToolCall]:
    return [ToolCall(i, i, name, args, error) for i, (name, args, error) in enumerate(specs)]


CASES = [
    ("length_cap", _record(turns=[Turn(1, 0, "stop", 10, 64), Turn(2, 1, "length", 64, 64)]),
     _record(turns=[Turn(1, 0, "stop", 10, 64)])),
    ("length_cap", _record(turns=[Turn(1, 0, "stop", 64, 64)]),
     _record(turns=[Turn(1, 0, "stop", 63, 64)])),
    ("repeated_tool_calls", _record(tools=_tools(*[("calc", '{"e":"1"}', False)] * 3)),
     _record(tools=_tools(("calc", '{"e":"1"}', False), ("calc", '{"e":"2"}', False),
                          ("calc", '{"e":"1"}', False)))),
    ("tool_error_streak", _record(tools=_tools(("a", "1", True), ("b", "2", True),
                                               ("a", "3", True))),
     _record(tools=_tools(("a", "1", True), ("b", "2", False), ("a", "3", True),
                          ("a", "4", True)))),
    ("copied_prompt",
     _record(attributes={semconv.INPUT_VALUE: "Q: copy me please, the whole sentence here.",
                         semconv.OUTPUT_VALUE: json.dumps(
                             {"answer": "copy me  please, the whole sentence"})}),
     _record(attributes={semconv.INPUT_VALUE: "Q: copy me please, the whole sentence here.",
                         semconv.OUTPUT_VALUE: json.dumps({"answer": "copy me please"})})),
    ("format_failure", _record(evaluations=[Evaluation("format", 0.0, "format_error")]),
     _record(evaluations=[Evaluation("format", 0.2, "ok"), Evaluation("reward", 0.0, "wrong")])),
    ("format_failure", _record(evaluations=[Evaluation("gsm8k", 0.0, "no_answer")]),
     _record(evaluations=[Evaluation("gsm8k", 0.0, "incorrect")])),
]


@pytest.mark.parametrize(("name", "positive", "negative"), CASES)
def test_each_detector_flags_its_failure_and_not_the_near_miss(name, positive, negative):
    assert DETECTORS[name](positive)
    assert not DETECTORS[name](negative)


def _records(rewards, lengths=None, groups=None, correct=None):
    out = []
    for i, reward in enumerate(rewards):
        attrs = {semconv.ROLLOUT_REWARD: reward,
                 semconv.ROLLOUT_SAMPLE_INDEX: groups[i] if groups else i}
        turns = [Turn(i, 0, "stop", lengths[i], None)] if lengths else []
        evaluations = [Evaluation("correctness", correct[i])] if correct else []
        out.append(TrajectoryRecord(i, attrs, turns=turns, evaluations=evaluations))
    return out


def test_step_detectors():
    degenerate = _detect.detect_degenerate_groups(
        _records([1.0, 1.0, 1.0, 0.5, 0.7, 0.2], groups=[0, 0, 0, 1, 1, 1]), [])
    assert sorted(degenerate) == [0, 1, 2] and degenerate[0]["advantage"] == 0.0
    spread = [0.1 * (i % 10) for i in range(40)]
    assert _detect.detect_reward_outliers(_records(spread + [9.0]), []) == {
        40: _detect.detect_reward_outliers(_records(spread + [9.0]), [])[40]}
    assert _detect.detect_reward_outliers(_records([0.0, 1.0] * 20), []) == {}  # binary: none
    lengths = [100 + 7 * (i % 9) for i in range(30)] + [2000]
    assert list(_detect.detect_length_outliers(_records([0.0] * 31, lengths=lengths), [])) == [30]
    summary = _detect._StepSummary
    rising = [summary(1, 1.0, 0.9), summary(2, 1.2, 0.7), summary(3, 1.5, 0.5)]
    records = _records([2.0, 1.0, 2.5], correct=[0.0, 1.0, 1.0])
    assert list(_detect.detect_reward_hacking(records, rising)) == [0]
    flat = [summary(1, 1.0, 0.9), summary(2, 1.2, 0.9), summary(3, 1.5, 0.5)]
    assert _detect.detect_reward_hacking(records, flat) == {}
    assert _detect.detect_reward_hacking(records, rising[1:]) == {}  # too little history


def _pipeline(detectors):
    exporter = InMemorySpanExporter()
    processor = FlaggingProcessor(SimpleSpanProcessor(exporter), detectors)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider, processor, exporter


def _trajectory(tracer, step=1, sample=0, finish="stop", tokens=5):
    with tracer.start_as_current_span("traj", attributes={
            semconv.OTEL_VERL_TRAJECTORY: True, semconv.ROLLOUT_STEP: step,
            semconv.ROLLOUT_SAMPLE_INDEX: sample}):
        with tracer.start_as_current_span("chat", attributes={
                semconv.GEN_AI_OPERATION_NAME: "chat",
                semconv.GEN_AI_RESPONSE_FINISH_REASONS: (finish,),
                semconv.GEN_AI_USAGE_OUTPUT_TOKENS: tokens}):
            pass


def test_the_worker_flags_the_trajectory_span_and_passes_every_span_on():
    provider, processor, exporter = _pipeline(["length_cap"])
    tracer = provider.get_tracer("t")
    _trajectory(tracer, finish="length")
    _trajectory(tracer, sample=1)
    assert processor.force_flush(5000)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["chat", "chat", "traj", "traj"]
    roots = {s.attributes[semconv.ROLLOUT_SAMPLE_INDEX]: s for s in spans if s.name == "traj"}
    assert roots[0].attributes[semconv.RL_FLAGS] == ("length_cap",)
    assert roots[0].attributes[semconv.flag_key("length_cap")] is True
    evidence = json.loads(roots[0].attributes[semconv.flag_evidence_key("length_cap")])
    assert evidence == {"turn": 0, "finish_reason": "length", "output_tokens": 5}
    assert semconv.RL_FLAGS not in roots[1].attributes
    stats = processor.stats()
    assert stats["detect_trajectories"] == 2 and stats["detect_flag.length_cap"] == 1
    provider.shutdown()


def test_step_detectors_wait_for_the_step_then_flag_the_group():
    provider, processor, exporter = _pipeline(["degenerate_group"])
    tracer = provider.get_tracer("t")
    for _ in range(3):
        with tracer.start_as_current_span("traj", attributes={
                semconv.OTEL_VERL_TRAJECTORY: True, semconv.ROLLOUT_STEP: 1,
                semconv.ROLLOUT_SAMPLE_INDEX: 0, semconv.ROLLOUT_REWARD: 1.0}):
            pass
    assert processor._drain(5.0, "sync")
    assert exporter.get_finished_spans() == ()  # the step is still current: they wait
    _trajectory(tracer, step=2)  # the next step starts: step 1 is decided
    assert processor._drain(5.0, "sync")
    roots = [s for s in exporter.get_finished_spans()
             if s.attributes.get(semconv.ROLLOUT_STEP) == 1]
    assert len(roots) == 3
    assert all(s.attributes[semconv.RL_FLAGS] == ("degenerate_group",) for s in roots)
    provider.shutdown()


def test_your_detector_and_one_that_raises(caplog):
    def empty_answer(record):
        return {"turns": len(record.turns)} if record.turns else None

    def broken(record):
        raise RuntimeError("boom")

    register_detector("test_empty_answer", empty_answer)
    register_detector("test_broken", broken)
    try:
        with pytest.raises(ValueError, match="built in"):
            register_detector("degenerate_group", empty_answer)
        with pytest.raises(ValueError):
            register_detector("Bad Name", empty_answer)
        provider, processor, exporter = _pipeline(["test_broken", "test_empty_answer"])
        _trajectory(provider.get_tracer("t"))
        assert processor.force_flush(5000)
        root = next(s for s in exporter.get_finished_spans() if s.name == "traj")
        assert root.attributes[semconv.RL_FLAGS] == ("test_empty_answer",)
        assert processor.stats()["detect_detector_errors"] == 1
        provider.shutdown()
    finally:
        DETECTORS.pop("test_empty_answer", None)
        DETECTORS.pop("test_broken", None)


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                    st.lists(st.text(max_size=5), max_size=3).map(tuple))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from([
    semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_RESPONSE_FINISH_REASONS,
    semconv.GEN_AI_USAGE_OUTPUT_TOKENS, semconv.GEN_AI_REQUEST_MAX_TOKENS,
    semconv.GEN_AI_TOOL_NAME, semconv.GEN_AI_TOOL_CALL_ARGUMENTS, semconv.ERROR_TYPE,
    semconv.ROLLOUT_REWARD, semconv.INPUT_VALUE, semconv.OUTPUT_VALUE]), _VALUES), max_size=6),
    st.sampled_from(["chat", "execute_tool", "text_completion", None]))
def test_hostile_spans_never_break_the_detectors(attribute_sets, operation):
    provider, processor, exporter = _pipeline(list(_detect.known_detectors()))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("traj", attributes={semconv.OTEL_VERL_TRAJECTORY: True}):
        for attributes in attribute_sets:
            if operation:
                attributes = {**attributes, semconv.GEN_AI_OPERATION_NAME: operation}
            with tracer.start_as_current_span("child", attributes=attributes) as span:
                span.add_event(semconv.GEN_AI_EVALUATION_RESULT, {
                    semconv.GEN_AI_EVALUATION_NAME: "format",
                    semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.0})
    assert processor.force_flush(5000)
    assert len(exporter.get_finished_spans()) == len(attribute_sets) + 1
    assert processor.stats().get("detect_detector_errors", 0) == 0
    provider.shutdown()


def test_a_stored_span_whose_operation_is_a_list_is_read_not_raised():
    """A decoded store line can carry ``gen_ai.operation.name`` as a JSON list (unhashable): the
    detectors' reader takes it as "not a model call", as the store's record does."""
    spans = [{"span_id": "01", "name": "traj", "attributes": {semconv.OTEL_VERL_TRAJECTORY: True}},
             {"span_id": "02", "name": "odd", "start_ns": 1,
              "attributes": {semconv.GEN_AI_OPERATION_NAME: ["chat", "x"]}},
             {"span_id": "03", "name": "chat", "start_ns": 2,
              "attributes": {semconv.GEN_AI_OPERATION_NAME: "chat",
                             semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 5}}]
    record = _detect.record_from_spans(spans)
    assert [turn.output_tokens for turn in record.turns] == [5]


def test_reward_components_and_a_per_turn_reward_are_evaluation_results():
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogExporter, SimpleLogRecordProcessor

    logs = InMemoryLogExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    _evaluations.set_logger_provider(logger_provider)
    try:
        with capture_spans() as exporter:
            @otel_verl.rollout_trace_op
            def tool_call():
                otel_verl._evaluations.record_reward_component(
                    "tool_reward", 0.25, label="useful", turn=True)

            with otel_verl.rollout_trace_attr(step=1, sample_index=0, rollout_n=0):
                tool_call()
                otel_verl.record_reward(1.2, name="verifier", label="correct", components={
                    "correctness": 1.0,
                    "format": {"score": 0.2, "label": "ok", "explanation": "#### found"}})
            spans = {s.name: s for s in exporter.get_finished_spans()}
    finally:
        _evaluations.set_logger_provider(None)
    root = spans["rollout_trace"]
    turn = next(s for name, s in spans.items() if name.endswith("tool_call"))
    assert root.attributes[semconv.RL_REWARD_PREFIX + "correctness"] == 1.0
    assert root.attributes[semconv.RL_REWARD_PREFIX + "format.label"] == "ok"
    assert turn.attributes[semconv.RL_REWARD_PREFIX + "tool_reward"] == 0.25
    results = [dict(e.attributes) for e in root.events
               if e.name == semconv.GEN_AI_EVALUATION_RESULT]
    names = [r[semconv.GEN_AI_EVALUATION_NAME] for r in results]
    assert names == ["tool_reward", "verifier", "correctness", "format"]
    assert results[0][semconv.OTEL_VERL_EVALUATED_SPAN_ID] == format(
        turn.context.span_id, "016x")
    assert results[3][semconv.GEN_AI_EVALUATION_EXPLANATION] == "#### found"
    assert [e.name for e in turn.events] == [semconv.GEN_AI_EVALUATION_RESULT]
    # the same results as log-based events, each in the context of the span it evaluates
    records = [r.log_record for r in logs.get_finished_logs()]
    assert [r.event_name for r in records] == [semconv.GEN_AI_EVALUATION_RESULT] * 5
    assert records[0].span_id == turn.context.span_id
    assert {r.span_id for r in records[1:]} == {root.context.span_id}
    assert records[4].attributes[semconv.GEN_AI_EVALUATION_SCORE_LABEL] == "ok"


@pytest.mark.parametrize(("value", "expected"), [
    (None, ()), ("", ()), ("none", ()), ("[length_cap]", ("length_cap",)),
    ("length_cap, format_failure,length_cap", ("length_cap", "format_failure")),
    (["Degenerate_Group"], ("degenerate_group",)), ("all", _detect.known_detectors()),
    (["length_cap", "all"], _detect.known_detectors()),
])
def test_detect_flags_option(value, expected):
    from otel_verl._config import resolve_config

    assert resolve_config({"detect_flags": value}, None, {}).detect_flags == expected


@pytest.mark.parametrize("value", ["nope", ["length_cap", 3], {"a": 1}])
def test_detect_flags_option_refuses_unknown_detectors(value):
    from otel_verl._config import ConfigError, resolve_config

    with pytest.raises(ConfigError):
        resolve_config({"detect_flags": value}, None, {})


def test_detect_flags_from_the_environment_and_tail_keep_flags(monkeypatch):
    from otel_verl._config import resolve_config

    config = resolve_config({}, None, {"OTEL_VERL_DETECT_FLAGS": "length_cap,copied_prompt"})
    assert config.detect_flags == ("length_cap", "copied_prompt")
    assert "flags" in resolve_config({"tail_keep": "flags,groups"}, None, {}).tail_keep
