"""What the integration changes in verl: names, decorated methods, verl-compatible behaviour."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import verl.utils.rollout_trace as rt

from otel_verl import semconv
from otel_verl.integrations.verl import _common, _facade, is_installed
from otel_verl.testing import capture_spans


def test_rollout_trace_module_is_routed_through_otel_verl():
    assert is_installed()
    assert rt.RolloutTraceConfig is _facade.RolloutTraceConfig
    assert rt.rollout_trace_attr is _facade.rollout_trace_attr
    assert rt.rollout_trace_op is _facade.rollout_trace_op
    # the originals are kept for verl's own mlflow/trackio backends
    assert _common.S.originals["RolloutTraceConfig"].__module__ == "verl.utils.rollout_trace"


@pytest.mark.parametrize(("module", "cls", "method"), [
    ("verl.experimental.agent_loop.tool_agent_loop", "ToolAgentLoop", "run"),
    ("verl.experimental.agent_loop.single_turn_agent_loop", "SingleTurnAgentLoop", "run"),
    ("verl.experimental.agent_loop.tool_parser", "HermesToolParser", "extract_tool_calls"),
    ("verl.workers.rollout.llm_server", "LLMServerClient", "generate"),
    ("verl.tools.base_tool", "BaseTool", "execute"),
])
def test_every_method_verl_decorates_gets_our_op(module, cls, method):
    import importlib

    fn = getattr(getattr(importlib.import_module(module), cls), method)
    assert getattr(fn, "__otel_verl_verl__", False), f"{cls}.{method} is not routed"
    assert fn.__qualname__ == f"{cls}.{method}"  # verl's op name is kept
    assert fn.__code__ not in _common.S.wrapper_codes  # not verl's own wrapper
    assert inspect.iscoroutinefunction(fn)


def test_agent_loop_worker_and_tools_are_patched():
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.tools.base_tool import BaseTool

    assert getattr(AgentLoopWorker, "__otel_verl_verl__", False)
    assert AgentLoopWorker.generate_sequences.__wrapped__.__qualname__ == \
        "AgentLoopWorker.generate_sequences"
    assert getattr(BaseTool.create, "__otel_verl_verl__", False)
    assert getattr(BaseTool.release, "__otel_verl_verl__", False)

    class LaterTool(BaseTool):  # defined after install: wrapped by __init_subclass__
        async def create(self, instance_id=None, **kwargs):
            return "x", None

    assert getattr(LaterTool.create, "__otel_verl_verl__", False)


class Loop:
    """Decorated with verl's name after the patch (as a user's agent loop would be)."""

    @rt.rollout_trace_op
    async def run(self, sampling_params, **kwargs):
        if kwargs.get("boom"):
            raise ValueError("boom")
        return {"ok": True}


class SyncLoop:
    @rt.rollout_trace_op
    def run(self, x):
        return x


def test_verl_decorator_applied_now_traces_with_verl_semantics():
    with capture_spans(experiment_name="e") as exporter:
        async def go():
            with rt.rollout_trace_attr(sample_index=3, step=2, rollout_n=1, name="agent_loop"):
                await Loop().run({"t": 1}, raw_prompt=[1])
            with rt.rollout_trace_attr(sample_index=4, step=2, trace=False):
                await Loop().run({"t": 1})  # silenced
            with pytest.raises(ValueError, match="boom"), rt.rollout_trace_attr(sample_index=5):
                await Loop().run({}, boom=True)

        asyncio.run(go())
    spans = exporter.get_finished_spans()
    names = sorted(s.name for s in spans)
    assert names == ["Loop.run", "Loop.run", "agent_loop", "rollout_trace"]
    run = next(s for s in spans if s.name == "Loop.run" and s.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 3)
    assert run.attributes[semconv.INPUT_VALUE].startswith('{"sampling_params"')
    assert '"kwargs"' in run.attributes[semconv.INPUT_VALUE]  # **kwargs as one key, like verl
    assert run.attributes[semconv.ROLLOUT_STEP] == 2
    failed = next(s for s in spans if s.name == "Loop.run" and s.attributes[semconv.ROLLOUT_SAMPLE_INDEX] == 5)
    assert failed.status.status_code.name == "ERROR"


def test_verl_init_signature_and_first_init_wins():
    rt.RolloutTraceConfig.init("p", "e1", "console", True, 3)
    rt.RolloutTraceConfig.init("p", "e2", "none", False, None)  # ignored, as in verl
    assert rt.RolloutTraceConfig.get_backend() == "console"
    assert rt.RolloutTraceConfig.enable_token2text() is True
    instance = rt.RolloutTraceConfig.get_instance()
    assert instance.experiment_name == "e1" and instance.project_name == "p"
    # verl's worker must not pick samples itself: our patched generate_sequences does
    assert instance.max_samples_per_step_per_worker is None
    assert rt.RolloutTraceConfig.sampler().limit == 3


@pytest.mark.parametrize(("backend", "env", "expected"), [
    (None, None, None),            # verl's default: off
    (None, "file", "file"),        # OTEL_VERL_BACKEND can turn it on behind verl's null
    ("console", "file", "console"),  # verl's key wins over the environment
    ("none", None, None),
    ("bogus", None, None),         # unknown name: off, like verl
])
def test_backend_from_verl_key_and_environment(monkeypatch, backend, env, expected):
    if env is not None:
        monkeypatch.setenv("OTEL_VERL_BACKEND", env)
    rt.RolloutTraceConfig.init("p", "e", backend)
    assert rt.RolloutTraceConfig.get_backend() == expected


def test_verl_own_backends_go_to_verl_code(monkeypatch):
    original = _common.S.originals["RolloutTraceConfig"]
    seen = []

    def fake_init(project_name, experiment_name, backend, token2text=False,
                  max_samples_per_step_per_worker=None):
        seen.append((project_name, experiment_name, backend, token2text,
                     max_samples_per_step_per_worker))
        instance = original.get_instance()
        instance.backend, instance._initialized = backend, True

    monkeypatch.setattr(original, "init", fake_init)
    rt.RolloutTraceConfig.init("p", "e", "mlflow", False, 2)
    assert seen == [("p", "e", "mlflow", False, 2)]
    assert rt.RolloutTraceConfig.get_backend() == "mlflow"
    assert rt.RolloutTraceConfig.get_instance() is original.get_instance()
    # and our ops hand over to verl's original wrappers (which see backend mlflow)
    # our ops hand over to verl's original wrapper, which asks verl's config for the backend
    asked = []
    monkeypatch.setattr(original, "get_backend",
                        classmethod(lambda cls: asked.append(1)))  # None: verl passes through
    assert SyncLoop().run(5) == 5
    assert asked, "verl's own wrapper was not used for verl's own backend"
