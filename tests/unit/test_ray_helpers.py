"""otel_verl.integrations.ray without a Ray cluster: the wrapper's contract, called in-process."""

from __future__ import annotations

import asyncio
import inspect
import json
import os

import pytest

from otel_verl import (
    RolloutTraceConfig,
    inject_context,
    rollout_trace_attr,
    rollout_trace_op,
    semconv,
)
from otel_verl.integrations.ray import (
    CARRIER_KWARG,
    call_with_context,
    carrier_kwargs,
    runtime_env,
    traced_remote,
)
from otel_verl.testing import capture_spans


@traced_remote
@rollout_trace_op
def score(solution: str, *, bonus: float = 0.0, **extra: object) -> float:
    return float(solution == "42") + bonus


@traced_remote(flush=False)
class Tool:
    @rollout_trace_op
    def run(self, x: int) -> int:
        return x * 2

    @rollout_trace_op
    async def arun(self, x: int) -> int:
        return x * 3

    def _private(self) -> int:
        return 1


def test_signature_gains_a_keyword_only_carrier_that_ray_can_bind() -> None:
    sig = inspect.signature(score)
    params = list(sig.parameters.values())
    assert [p.name for p in params] == ["solution", "bonus", CARRIER_KWARG, "extra"]
    assert sig.parameters[CARRIER_KWARG].kind is inspect.Parameter.KEYWORD_ONLY
    # Ray validates a call by binding it to the signature, looking through __wrapped__
    assert inspect.unwrap(score) is score
    sig.bind("42", **{CARRIER_KWARG: {}})
    with pytest.raises(TypeError):
        sig.bind("42", "too", "many")
    method_sig = inspect.signature(inspect.unwrap(Tool.run))
    assert CARRIER_KWARG in method_sig.parameters
    assert inspect.iscoroutinefunction(Tool.arun)  # Ray detects async actors by this
    assert Tool._private(Tool()) == 1  # private methods left alone
    assert not getattr(Tool._private, "_otel_verl_traced_remote", False)


def test_wrapper_continues_the_callers_trajectory() -> None:
    with capture_spans(experiment_name="helpers") as exporter:
        with rollout_trace_attr(sample_index=4, step=2):
            carrier = inject_context()
        # called later, outside the trajectory, as a Ray worker would
        assert score("42", bonus=0.5, **{CARRIER_KWARG: carrier}) == 1.5
        assert Tool().run(3, **{CARRIER_KWARG: carrier}) == 6
        assert asyncio.run(Tool().arun(3, **{CARRIER_KWARG: carrier})) == 9
        assert score("41") == 0.0  # no carrier: still works, outside the trajectory
        spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "rollout_trace"]
    in_trace = {s.name: s for s in spans if s.context.trace_id == root.context.trace_id}
    assert sorted(in_trace) == ["Tool.arun", "Tool.run", "rollout_trace", "score"]
    for name in ("score", "Tool.run", "Tool.arun"):
        span = in_trace[name]
        assert span.parent.span_id == root.context.span_id, name
        assert span.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 4, name
        assert span.attributes[semconv.ROLLOUT_STEP] == 2, name
        assert CARRIER_KWARG not in span.attributes.get(semconv.INPUT_VALUE, ""), name
    outside = [s for s in spans if s.context.trace_id != root.context.trace_id]
    assert all(semconv.ROLLOUT_SAMPLE_INDEX not in s.attributes for s in outside)


def test_call_with_context_passes_the_carrier() -> None:
    seen = {}

    class FakeRemote:
        def remote(self, *args, **kwargs):
            seen.update(args=args, kwargs=kwargs)
            return "ref"

    with capture_spans() as _, rollout_trace_attr(sample_index=1, step=1):
        assert call_with_context(FakeRemote(), 1, k=2) == "ref"
        assert call_with_context(FakeRemote().remote, 1) == "ref"
        assert set(carrier_kwargs()) == {CARRIER_KWARG}
    assert seen["args"] == (1,)
    carrier = seen["kwargs"][CARRIER_KWARG]
    assert carrier["traceparent"].startswith("00-")
    assert semconv.CARRIER_TRAJECTORY in carrier


def test_runtime_env_carries_the_config_with_absolute_dirs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    RolloutTraceConfig.init("p", "e", backend="file", trace_dir="rel/traces")
    env = runtime_env({"env_vars": {"KEEP": "1"}, "pip": ["x"]})
    assert env["pip"] == ["x"] and env["env_vars"]["KEEP"] == "1"
    config = json.loads(env["env_vars"]["OTEL_VERL_CONFIG"])
    assert config["trace_dir"] == os.path.join(str(tmp_path), "rel/traces")
    assert config["backend"] == "file" and config["experiment_name"] == "e"
