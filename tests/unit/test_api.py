"""The verl-compatible API: behaviours verl users rely on, plus the span contract."""

import asyncio
import json
import pickle

import pytest
from opentelemetry.trace import StatusCode

from otel_verl import (
    RolloutTraceConfig,
    SpanKindName,
    get_tracer,
    inject_context,
    is_recording,
    record_reward,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
    traceparent_headers,
    use_context,
)
from otel_verl.testing import capture_spans
from otel_verl.testing import spans_by_name as by_name


class Agent:
    def __init__(self):
        self.calls = 0

    @rollout_trace_op
    def sync_op(self, a, b=2, *, c=3):
        self.calls += 1
        return {"sum": a + b + c}

    @rollout_trace_op
    async def run(self, sampling_params, **kwargs):
        self.calls += 1
        await self.turn(prompt_ids=[1, 2])
        return {"ok": True, "kwargs_seen": sorted(kwargs)}

    @rollout_trace_op(kind=SpanKindName.LLM)
    async def turn(self, prompt_ids):
        return {"token_ids": [3, 4]}

    @rollout_trace_op
    async def boom(self, x):
        raise KeyError(x)

    @rollout_trace_op
    def numbers(self, n):
        yield from range(n)

    @rollout_trace_op
    async def anumbers(self, n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i


@rollout_trace_op
def plain_function(x, y=10):
    return x * y


def test_untraced_passthrough_when_not_initialised():
    agent = Agent()
    assert agent.sync_op(1) == {"sum": 6}
    assert asyncio.run(agent.run({}, a=1)) == {"ok": True, "kwargs_seen": ["a"]}
    assert list(agent.numbers(3)) == [0, 1, 2]
    assert plain_function(2) == 20
    assert not is_recording()
    assert traceparent_headers() == {}


def test_unknown_backend_turns_tracing_off(caplog):
    RolloutTraceConfig.init("p", "e", "no-such-backend")
    assert RolloutTraceConfig.get_backend() is None
    assert not is_recording()
    assert "unknown backend" in caplog.text
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init("p", "e", None)
    assert RolloutTraceConfig.get_backend() is None


def test_only_first_init_takes_effect(spans):
    RolloutTraceConfig.init("other", "other", "file")
    assert RolloutTraceConfig.get_instance().project_name == "proj"


def test_input_binding_like_verl(spans):
    agent = Agent()
    agent.sync_op(1, c=5)
    asyncio.run(agent.run({"temperature": 1.0}, raw_prompt="hi", index=7))
    plain_function(3)
    got = by_name(spans)
    assert json.loads(got["Agent.sync_op"].attributes[semconv.INPUT_VALUE]) == {"a": 1, "b": 2,
                                                                                 "c": 5}
    assert json.loads(got["Agent.run"].attributes[semconv.INPUT_VALUE]) == {
        "sampling_params": {"temperature": 1.0}, "kwargs": {"raw_prompt": "hi", "index": 7}}
    assert json.loads(got["plain_function"].attributes[semconv.INPUT_VALUE]) == {"x": 3, "y": 10}
    assert json.loads(got["Agent.sync_op"].attributes[semconv.OUTPUT_VALUE]) == {"sum": 8}
    assert got["Agent.turn"].attributes[semconv.OPENINFERENCE_SPAN_KIND] == "LLM"
    assert got["Agent.turn"].parent.span_id == got["Agent.run"].context.span_id


def test_exception_recorded_and_reraised_unchanged(spans):
    agent = Agent()
    with pytest.raises(KeyError) as info:
        asyncio.run(agent.boom("x"))
    assert info.value.args == ("x",)
    span = by_name(spans)["Agent.boom"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"
    assert span.events[0].attributes["exception.type"] == "KeyError"


def test_trajectory_attributes_on_every_span(spans):
    agent = Agent()

    async def main():
        with rollout_trace_attr(sample_index=5, step=3, rollout_n=1, name="agent_loop") as span:
            assert span is not None
            await agent.run({})
            with get_tracer().start_as_current_span("hand_made"):
                pass

    asyncio.run(main())
    got = by_name(spans)
    root = got["agent_loop"]
    assert root.attributes[semconv.OTEL_VERL_TRAJECTORY] is True
    for name in ("agent_loop", "Agent.run", "Agent.turn", "hand_made"):
        attrs = got[name].attributes
        assert attrs[semconv.ROLLOUT_STEP] == 3
        assert attrs[semconv.ROLLOUT_SAMPLE_INDEX] == 5
        assert attrs[semconv.ROLLOUT_ROLLOUT_N] == 1
        assert attrs[semconv.ROLLOUT_VALIDATE] is False
        assert attrs[semconv.ROLLOUT_EXPERIMENT_NAME] == "exp"
        assert got[name].context.trace_id == root.context.trace_id
    assert got["Agent.run"].attributes[semconv.OTEL_VERL_TRAJECTORY_CHILD] is True
    assert got["hand_made"].attributes[semconv.OTEL_VERL_TRAJECTORY_CHILD] is True
    assert semconv.OTEL_VERL_TRAJECTORY_CHILD not in got["Agent.turn"].attributes
    assert got["Agent.run"].parent.span_id == root.context.span_id


def test_trace_false_silences_and_nested_restores(spans):
    agent = Agent()
    with rollout_trace_attr(step=1, sample_index=0):
        agent.sync_op(1)
        with rollout_trace_attr(step=1, sample_index=1, trace=False) as silenced:
            assert silenced is None
            agent.sync_op(2)
            assert not is_recording()
            assert get_tracer().start_span("x").is_recording() is False
        agent.sync_op(3)
    calls = [s for s in spans.get_finished_spans() if s.name == "Agent.sync_op"]
    assert [json.loads(s.attributes[semconv.INPUT_VALUE])["a"] for s in calls] == [1, 3]
    assert agent.calls == 3


def test_trace_false_restored_after_exception(spans):
    agent = Agent()
    with pytest.raises(RuntimeError):
        with rollout_trace_attr(sample_index=1, trace=False):
            raise RuntimeError("inside")
    agent.sync_op(1)
    assert [s.name for s in spans.get_finished_spans()] == ["Agent.sync_op"]


def test_trajectory_span_records_exception(spans):
    with pytest.raises(ValueError):
        with rollout_trace_attr(sample_index=1, name="traj"):
            raise ValueError("bad")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR


def test_generators_traced(spans):
    agent = Agent()
    assert list(agent.numbers(3)) == [0, 1, 2]

    async def consume():
        return [i async for i in agent.anumbers(2)]

    assert asyncio.run(consume()) == [0, 1]
    got = by_name(spans)
    assert json.loads(got["Agent.numbers"].attributes[semconv.OUTPUT_VALUE]) == [0, 1, 2]
    assert json.loads(got["Agent.anumbers"].attributes[semconv.OUTPUT_VALUE]) == [0, 1]


def test_generator_exception_recorded(spans):
    @rollout_trace_op
    def bad():
        yield 1
        raise OSError("disk")

    with pytest.raises(OSError):
        list(bad())
    assert by_name(spans)["test_generator_exception_recorded.<locals>.bad"].status.status_code \
        is StatusCode.ERROR


def test_thousand_concurrent_trajectories_no_cross_talk(spans):
    class Loop:
        @rollout_trace_op
        async def run(self, sample):
            await asyncio.sleep(0)
            await self.turn(sample)
            return sample

        @rollout_trace_op
        async def turn(self, sample):
            await asyncio.sleep(0)
            return sample

    loop = Loop()

    async def one(i):
        with rollout_trace_attr(sample_index=i, step=i % 7, rollout_n=i % 3, name="traj"):
            await asyncio.sleep(0)
            return await loop.run(i)

    async def main():
        return await asyncio.gather(*(one(i) for i in range(1000)))

    assert asyncio.run(main()) == list(range(1000))
    finished = spans.get_finished_spans()
    assert len(finished) == 3000
    roots = {s.context.trace_id: s for s in finished if s.name == "traj"}
    assert len(roots) == 1000
    for span in finished:
        root = roots[span.context.trace_id]
        for key in (semconv.ROLLOUT_SAMPLE_INDEX, semconv.ROLLOUT_STEP, semconv.ROLLOUT_ROLLOUT_N):
            assert span.attributes[key] == root.attributes[key]
        if span.name != "traj":
            assert json.loads(span.attributes[semconv.INPUT_VALUE])["sample"] == \
                root.attributes[semconv.ROLLOUT_SAMPLE_INDEX]


def test_token2text_adds_text_to_a_copy_and_never_mutates():
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(f"t{i}" for i in ids)

    class Loop:
        tokenizer = Tok()

        @rollout_trace_op
        async def run(self):
            return self.out

        @rollout_trace_op
        async def generate(self, request_id, *, prompt_ids):
            return {"token_ids": [7, 8]}

    loop = Loop()
    loop.out = {"prompt_ids": [1, 2], "response_ids": [3]}
    with capture_spans(token2text=True) as exporter:
        result = asyncio.run(loop.run())
        asyncio.run(loop.generate("r", prompt_ids=[5]))
    assert result is loop.out and result == {"prompt_ids": [1, 2], "response_ids": [3]}
    got = by_name(exporter)
    out = json.loads(got["test_token2text_adds_text_to_a_copy_and_never_mutates.<locals>.Loop.run"]
                     .attributes[semconv.OUTPUT_VALUE])
    assert out["prompt_text"] == "t1 t2" and out["response_text"] == "t3"
    gen = json.loads(got["test_token2text_adds_text_to_a_copy_and_never_mutates.<locals>.Loop."
                         "generate"].attributes[semconv.OUTPUT_VALUE])
    assert gen["prompt_text"] == "t5" and gen["response_text"] == "t7 t8"


def test_token2text_off_by_default(spans):
    class Loop:
        class tokenizer:  # noqa: N801
            @staticmethod
            def decode(ids, skip_special_tokens=False):
                raise AssertionError("must not decode")

        @rollout_trace_op
        def run(self):
            return {"prompt_ids": [1]}

    Loop().run()
    assert "prompt_text" not in json.loads(spans.get_finished_spans()[0]
                                           .attributes[semconv.OUTPUT_VALUE])


def test_record_reward_lands_on_trajectory(spans):
    with rollout_trace_attr(sample_index=1, name="traj"):
        record_reward(1.0, label="correct")
    (span,) = spans.get_finished_spans()
    assert span.attributes[semconv.ROLLOUT_REWARD] == 1.0
    event = span.events[0]
    assert event.name == semconv.GEN_AI_EVALUATION_RESULT
    assert event.attributes[semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 1.0
    assert event.attributes[semconv.GEN_AI_EVALUATION_SCORE_LABEL] == "correct"


def test_carrier_continues_trace_and_trajectory(spans):
    with rollout_trace_attr(sample_index=4, step=2, name="traj"):
        carrier = inject_context()
        headers = traceparent_headers()
    assert set(headers) >= {"traceparent"}
    assert carrier["traceparent"] == headers["traceparent"]
    # as if in another process
    with use_context(carrier):
        with get_tracer().start_as_current_span("remote_work"):
            pass
    got = by_name(spans)
    remote, root = got["remote_work"], got["traj"]
    assert remote.context.trace_id == root.context.trace_id
    assert remote.parent.span_id == root.context.span_id
    assert remote.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 4


def test_carrier_carries_silence(spans):
    with rollout_trace_attr(sample_index=4, trace=False):
        carrier = inject_context()
    with use_context(carrier):
        assert not is_recording()
    assert is_recording()


def test_decorated_functions_pickle():
    assert pickle.loads(pickle.dumps(plain_function))(2) == 20


def test_internal_error_does_not_break_the_rollout(caplog):
    class Unserialisable:
        def __repr__(self):
            raise RuntimeError("repr broke")

    @rollout_trace_op
    def echo(x):
        return x

    with capture_spans(strict=False) as exporter:
        assert echo(Unserialisable()).__class__ is Unserialisable
    span = exporter.get_finished_spans()[0]
    # an unknown type is recorded by its name; its repr is never called
    assert span.attributes[semconv.INPUT_VALUE].endswith('Unserialisable>"}')


def test_numpy_trajectory_attributes_are_plain_numbers(spans):
    np = __import__("numpy")
    with rollout_trace_attr(sample_index=np.int64(5), step=np.int32(2), rollout_n=np.int64(0)):
        pass
    (span,) = spans.get_finished_spans()
    assert span.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 5
    assert span.attributes[semconv.ROLLOUT_STEP] == 2


def test_generator_send_and_throw_are_forwarded(spans):
    @rollout_trace_op
    def echo():
        received = []
        while True:
            try:
                value = yield len(received)
            except ValueError:
                value = "thrown"
            if value is None:
                return received
            received.append(value)

    gen = echo()
    assert next(gen) == 0
    assert gen.send("a") == 1
    assert gen.throw(ValueError("x")) == 2
    with pytest.raises(StopIteration) as stop:
        gen.send(None)
    assert stop.value.value == ["a", "thrown"]
    (span,) = spans.get_finished_spans()
    assert json.loads(span.attributes[semconv.OUTPUT_VALUE]) == ["a", "thrown"]
    assert span.status.status_code is StatusCode.UNSET


def test_generator_closed_early_still_ends_its_span(spans):
    agent = Agent()
    gen = agent.numbers(10)
    assert next(gen) == 0
    gen.close()
    (span,) = spans.get_finished_spans()
    assert json.loads(span.attributes[semconv.OUTPUT_VALUE]) == [0]


def test_async_generator_asend_and_athrow_are_forwarded(spans):
    @rollout_trace_op
    async def echo():
        got = []
        while True:
            try:
                value = yield len(got)
            except ValueError:
                value = "thrown"
            if value is None:
                return
            got.append(value)

    async def drive():
        gen = echo()
        assert await gen.__anext__() == 0
        assert await gen.asend("a") == 1
        assert await gen.athrow(ValueError("x")) == 2
        with pytest.raises(StopAsyncIteration):
            await gen.asend(None)

    asyncio.run(drive())
    (span,) = spans.get_finished_spans()
    assert json.loads(span.attributes[semconv.OUTPUT_VALUE]) == [0, 1, 2]


def test_exception_text_is_redacted(spans):
    @rollout_trace_op
    def call_api():
        raise ConnectionError("GET https://x/api?key=1 failed: Bearer abcdefghijklmnop1234 "
                              "rejected, key sk-abcdefghijklmnopqrstu")

    with rollout_trace_attr(sample_index=1, name="traj"):
        with pytest.raises(ConnectionError, match="sk-abcdefghijklmnopqrstu"):  # unchanged for the caller
            call_api()
    for span in spans.get_finished_spans():
        texts = [span.status.description or ""] + [
            str(v) for e in span.events for v in e.attributes.values()]
        assert not any("abcdefghijklmnop1234" in t or "sk-abcdefghijklmnopqrstu" in t
                       for t in texts), span.name
    op = by_name(spans)["test_exception_text_is_redacted.<locals>.call_api"]
    assert "[REDACTED]" in op.events[0].attributes["exception.message"]
    assert op.events[0].attributes["exception.type"] == "ConnectionError"


def test_capture_payloads_off_records_metadata_only():
    agent = Agent()
    with capture_spans(capture_payloads=False, token2text=True) as exporter:
        with rollout_trace_attr(step=1, sample_index=2):
            asyncio.run(agent.run({"temperature": 1.0}, raw_prompt="secret-ish content"))
    for span in exporter.get_finished_spans():
        assert semconv.INPUT_VALUE not in span.attributes
        assert semconv.OUTPUT_VALUE not in span.attributes
        assert span.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 2
    assert {s.name for s in exporter.get_finished_spans()} == {"rollout_trace", "Agent.run",
                                                               "Agent.turn"}


class _HostileOwner:
    """An agent loop whose ``__getattr__`` raises for anything it lacks (``tokenizer`` too)."""

    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")

    @rollout_trace_op
    def run_sync(self):
        return {"prompt_ids": [1]}

    @rollout_trace_op
    async def run(self):
        return {"prompt_ids": [1]}


def test_token2text_owner_whose_getattr_raises_keeps_the_result():
    """issue 25 item 8: the op succeeded; token2text must not turn it into the owner's error."""
    owner = _HostileOwner()
    with capture_spans(token2text=True) as exporter:
        assert owner.run_sync() == {"prompt_ids": [1]}
        assert asyncio.run(owner.run()) == {"prompt_ids": [1]}
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    for span in spans:
        assert span.status.status_code is not StatusCode.ERROR
        assert json.loads(span.attributes[semconv.OUTPUT_VALUE]) == {"prompt_ids": [1]}


def test_token2text_decode_without_skip_special_tokens_falls_back():
    """A tokenizer whose decode takes only the ids (verl calls ``decode(ids)``)."""
    class Tok:
        def decode(self, ids):
            return "|".join(map(str, ids))

    class Loop:
        tokenizer = Tok()

        @rollout_trace_op
        async def run(self):
            return {"prompt_ids": [1, 2], "response_ids": [3]}

    with capture_spans(token2text=True) as exporter:
        asyncio.run(Loop().run())
    (span,) = exporter.get_finished_spans()
    out = json.loads(span.attributes[semconv.OUTPUT_VALUE])
    assert out["prompt_text"] == "1|2" and out["response_text"] == "3"


# --- drop-in API users: what the trajectory's root row shows when nothing sets it (issue 24) -----


class DropInLoop:
    """An agent loop written the verl way: ops only, no set_trajectory_input/output."""

    @rollout_trace_op
    async def generate(self, request_id, *, prompt_ids):
        return {"token_ids": [7, 8]}

    @rollout_trace_op
    async def run(self, sampling_params, **kwargs):
        await self.generate("r", prompt_ids=[1, 2])
        return {"response_ids": [7, 8], "num_turns": 2}

    @rollout_trace_op
    def compute_score(self, answer):
        return 0.5


def _trajectory(exporter):
    (traj,) = [s for s in exporter.get_finished_spans() if s.attributes.get(
        semconv.OTEL_VERL_TRAJECTORY)]
    return traj


def test_trajectory_shows_its_agent_loop_when_nothing_sets_it(spans):
    loop = DropInLoop()
    with rollout_trace_attr(step=1, sample_index=0, name="agent_loop"):
        asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "hi"}]))
        record_reward(1.0, label="correct")
    traj, run = _trajectory(spans), by_name(spans)["DropInLoop.run"]
    assert traj.attributes[semconv.INPUT_VALUE] == run.attributes[semconv.INPUT_VALUE]
    assert json.loads(traj.attributes[semconv.INPUT_VALUE]) == {
        "sampling_params": {"temperature": 1.0},
        "kwargs": {"raw_prompt": [{"role": "user", "content": "hi"}]}}
    assert traj.attributes[semconv.INPUT_MIME_TYPE] == semconv.MIME_JSON
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {
        "response_ids": [7, 8], "num_turns": 2, "reward": 1.0, "reward_label": "correct"}
    assert traj.attributes[semconv.OTEL_VERL_TRAJECTORY_OP] == "DropInLoop.run"


def test_without_an_agent_op_input_is_the_first_top_level_op_and_output_the_last(spans):
    loop = DropInLoop()
    with rollout_trace_attr(step=1, sample_index=0):
        asyncio.run(loop.generate("r", prompt_ids=[1]))
        loop.compute_score("8")  # a second top-level op: its output (a number) is the last
        record_reward(0.5)
    traj = _trajectory(spans)
    assert json.loads(traj.attributes[semconv.INPUT_VALUE]) == {"request_id": "r",
                                                                "prompt_ids": [1]}
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {"output": 0.5, "reward": 0.5}
    assert traj.attributes[semconv.OTEL_VERL_TRAJECTORY_OP] == "DropInLoop.generate"


def test_the_agent_loop_op_wins_over_ops_beside_it(spans):
    """Tool create/release or a reward op beside ``run`` (verl's worker): the row is the run."""
    class Tool:
        @rollout_trace_op
        def create(self, instance_id):
            return {"created": instance_id}

    loop, tool = DropInLoop(), Tool()
    with rollout_trace_attr(step=1, sample_index=0):
        tool.create("i0")
        asyncio.run(loop.run({"temperature": 1.0}))
        loop.compute_score("8")
        record_reward(0.5)
    traj = _trajectory(spans)
    assert json.loads(traj.attributes[semconv.INPUT_VALUE]) == {"sampling_params": {
        "temperature": 1.0}, "kwargs": {}}
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {
        "response_ids": [7, 8], "num_turns": 2, "reward": 0.5}
    assert traj.attributes[semconv.OTEL_VERL_TRAJECTORY_OP] == "DropInLoop.run"


def test_what_the_code_sets_wins_over_what_the_ops_saw(spans):
    from otel_verl import set_trajectory_input, set_trajectory_output

    loop = DropInLoop()
    with rollout_trace_attr(step=1, sample_index=0):
        set_trajectory_input("the question")
        asyncio.run(loop.run({"temperature": 1.0}))
        set_trajectory_output(answer="42")
        record_reward(1.0)
    traj = _trajectory(spans)
    assert traj.attributes[semconv.INPUT_VALUE] == "the question"
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {"answer": "42", "reward": 1.0}
    assert semconv.OTEL_VERL_TRAJECTORY_OP not in traj.attributes
    # only the input set: the output still comes from the ops, the trajectory keeps its own name
    spans.clear()
    with rollout_trace_attr(step=1, sample_index=1):
        set_trajectory_input("q2")
        asyncio.run(loop.run({}))
    traj = _trajectory(spans)
    assert traj.attributes[semconv.INPUT_VALUE] == "q2"
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE])["num_turns"] == 2
    assert semconv.OTEL_VERL_TRAJECTORY_OP not in traj.attributes


def test_trajectory_without_ops_or_payloads_shows_only_what_it_has():
    with capture_spans() as exporter:
        with rollout_trace_attr(step=1, sample_index=0):
            record_reward(1.0)
    traj = _trajectory(exporter)
    assert semconv.INPUT_VALUE not in traj.attributes
    assert json.loads(traj.attributes[semconv.OUTPUT_VALUE]) == {"reward": 1.0}
    with capture_spans(capture_payloads=False) as exporter:
        with rollout_trace_attr(step=1, sample_index=0):
            asyncio.run(DropInLoop().run({}))
            record_reward(1.0)
    traj = _trajectory(exporter)
    assert semconv.INPUT_VALUE not in traj.attributes
    assert semconv.OUTPUT_VALUE not in traj.attributes


def test_op_kind_follows_verls_method_names_unless_given(spans):
    class Tool:
        @rollout_trace_op
        async def execute(self, instance_id, parameters):
            return {"text": "5"}

    class Other:
        @rollout_trace_op(kind=SpanKindName.EVALUATOR)
        def run(self):
            return 1

    loop = DropInLoop()
    asyncio.run(loop.run({}))
    asyncio.run(Tool().execute("i", {}))
    Other().run()
    loop.compute_score("x")
    kinds = {s.name.rsplit(".", 1)[-1] + ("/other" if "Other" in s.name else ""):
             s.attributes[semconv.OPENINFERENCE_SPAN_KIND] for s in spans.get_finished_spans()}
    assert kinds == {"generate": "LLM", "run": "AGENT", "execute": "TOOL", "run/other": "EVALUATOR",
                     "compute_score": "CHAIN"}


def test_an_op_inside_a_trajectory_is_validated_once_not_by_the_sdk_per_key(monkeypatch):
    """The trajectory attributes are validated once per trajectory and the op's own once, at
    start: the SDK's per-key cleaner never runs for a metadata-only op (it ran for every key of
    every span before); and the span still carries everything."""
    from opentelemetry import attributes as otel_attributes

    original = otel_attributes._clean_attribute_value
    cleaned: list = []

    def counting(value, limit):
        cleaned.append(value)
        return original(value, limit)

    @rollout_trace_op
    def step(x):
        return x

    with capture_spans(capture_payloads=False) as exporter:
        with rollout_trace_attr(step=3, sample_index=1, rollout_n=0):
            step(1)  # warm: nothing lazily built on the first call is counted
            monkeypatch.setattr(otel_attributes, "_clean_attribute_value", counting)
            step(2)
            monkeypatch.setattr(otel_attributes, "_clean_attribute_value", original)
    assert cleaned == []
    op = [s for s in exporter.get_finished_spans() if s.name.endswith("step")][-1]
    assert op.attributes["rollout.step"] == 3 and op.attributes["rollout.sample_index"] == 1
    assert op.attributes["otel_verl.trajectory_child"] is True
    assert op.attributes["openinference.span.kind"] == "CHAIN"
    assert op.attributes["session.id"] == "test/step-3/sample-1"
