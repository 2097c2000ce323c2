"""One small multi-turn tool-agent rollout, traceable three ways:

* ``OtelDriver``: OTel SDK spans shaped the way otel_verl emits them (trajectory span +
  ``rollout.*`` attributes on every span + payload / GenAI attributes), for any exporter;
* ``VerlWeaveDriver``: what verl's weave backend does (``client.create_call`` / ``finish_call``
  inside ``weave.attributes``), for the parity test;
* ``run_with_otel_verl``: through otel_verl's public API, when the core is present.

The rollout: ``ToolAgentLoop.run`` -> per turn ``AsyncLLMServerManager.generate`` (an LLM call with
token usage) and ``HermesToolParser.extract_tool_calls``; tool calls ``CalcTool.execute`` (the
second tool call of sample 1 fails); finally ``compute_score`` (the reward).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TURNS = 2
PROMPT_TOKENS = (11, 17)  # per turn
COMPLETION_TOKENS = (5, 3)
EXPERIMENT = "exp-weave-test"


class ToolFailed(RuntimeError):
    pass


@dataclass
class Op:
    name: str
    inputs: dict[str, Any]
    kind: str = "CHAIN"
    usage: tuple[int, int] | None = None
    output: Any = None
    error: BaseException | None = None
    children: list[Op] = field(default_factory=list)


def rollout_ops(sample_index: int, fail_tool: bool) -> Op:
    """The op tree of one trajectory (inputs/outputs included); deterministic."""
    run = Op(
        "ToolAgentLoop.run",
        {"sampling_params": {"temperature": 1.0}, "kwargs": {"index": sample_index, "raw_prompt": [
            {"role": "user", "content": f"what is {sample_index} + 2?"}]}},
        kind="AGENT",
        output={"num_turns": TURNS * 2, "reward_score": None},
    )
    for turn in range(TURNS):
        run.children.append(Op(
            "AsyncLLMServerManager.generate",
            {"request_id": f"req-{sample_index}", "prompt_ids": list(range(PROMPT_TOKENS[turn]))},
            kind="LLM",
            usage=(PROMPT_TOKENS[turn], COMPLETION_TOKENS[turn]),
            output={"token_ids": list(range(COMPLETION_TOKENS[turn])), "stop_reason": "stop"},
        ))
        run.children.append(Op(
            "HermesToolParser.extract_tool_calls",
            {"responses_ids": list(range(COMPLETION_TOKENS[turn]))},
            output=[{"name": "calc", "arguments": {"a": sample_index, "b": 2}}],
        ))
        failing = fail_tool and turn == 1
        run.children.append(Op(
            "CalcTool.execute",
            {"instance_id": f"inst-{sample_index}", "parameters": {"a": sample_index, "b": 2}},
            kind="TOOL",
            output=None if failing else {"text": str(sample_index + 2)},
            error=ToolFailed(f"calculator exploded on turn {turn}") if failing else None,
        ))
    run.children.append(Op(
        "compute_score", {"solution": str(sample_index + 2), "ground_truth": str(sample_index + 2)},
        kind="EVALUATOR", output=1.0,
    ))
    return run


#: (step, sample_index, rollout_n, fail_tool) of the trajectories every test sends
TRAJECTORIES = [(1, 0, 0, False), (1, 0, 1, False), (1, 1, 0, True), (2, 0, 0, False)]


def ops_per_trajectory() -> int:
    """Ops of one trajectory (verl's calls: no call for the trajectory itself)."""
    return 1 + TURNS * 3 + 1


def calls_per_trajectory() -> int:
    """Calls our exporter writes per trajectory by default: the ops + the trajectory's root."""
    return ops_per_trajectory() + 1


class OtelDriver:
    """Emits the rollout as OTel spans the way otel_verl shapes them."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    def run(self, step: int, sample_index: int, rollout_n: int, fail_tool: bool,
            validate: bool = False) -> None:
        traj = {
            "rollout.step": step, "rollout.sample_index": sample_index,
            "rollout.rollout_n": rollout_n, "rollout.validate": validate,
            "rollout.experiment_name": EXPERIMENT,
        }
        with self.tracer.start_as_current_span(
            "rollout_trace", attributes={**traj, "otel_verl.trajectory": True}
        ) as tspan:
            self._op(rollout_ops(sample_index, fail_tool), traj, top=True)
            tspan.set_attribute("rollout.reward", 1.0)

    def _op(self, op: Op, traj: dict[str, Any], top: bool = False) -> None:
        attrs: dict[str, Any] = {**traj, "openinference.span.kind": op.kind,
                                 "input.value": json.dumps(op.inputs),
                                 "input.mime_type": "application/json"}
        if top:
            attrs["otel_verl.trajectory_child"] = True
        if op.usage:
            attrs.update({"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL,
                          "gen_ai.usage.input_tokens": op.usage[0],
                          "gen_ai.usage.output_tokens": op.usage[1]})
        with contextlib.suppress(ToolFailed):
            with self.tracer.start_as_current_span(op.name, attributes=attrs) as span:
                for child in op.children:
                    self._op(child, traj)
                if op.error is not None:
                    raise op.error
                span.set_attribute("output.value", json.dumps(op.output))
                span.set_attribute("output.mime_type", "application/json")


class VerlWeaveDriver:
    """The same rollout traced as verl's weave backend does it."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, step: int, sample_index: int, rollout_n: int, fail_tool: bool,
            validate: bool = False) -> None:
        import weave
        from weave.trace.context import call_context

        attributes = {"sample_index": sample_index, "step": step, "rollout_n": rollout_n,
                      "validate": validate, "experiment_name": EXPERIMENT}
        with weave.attributes(attributes):
            self._op(rollout_ops(sample_index, fail_tool), call_context)

    def _op(self, op: Op, call_context: Any) -> None:
        call = self.client.create_call(
            op=op.name, inputs=op.inputs, attributes={**call_context.call_attributes.get()}
        )
        try:
            for child in op.children:
                with contextlib.suppress(ToolFailed):
                    self._op(child, call_context)
            if op.error is not None:
                raise op.error
            if op.usage:
                call.summary = {"usage": {MODEL: {
                    "prompt_tokens": op.usage[0], "completion_tokens": op.usage[1],
                    "total_tokens": sum(op.usage), "requests": 1}}}
            self.client.finish_call(call, output=op.output)
        except ToolFailed as exc:
            self.client.finish_call(call, exception=exc)
            raise


@contextlib.contextmanager
def otel_sdk_provider(exporter: Any, *extra_processors: Any) -> Iterator[Any]:
    """A local TracerProvider (never the global one) with a BatchSpanProcessor -> exporter."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "weave-exporter-test"}))
    # one batch at the final flush (deterministic: trajectory spans and their children together)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    for processor in extra_processors:
        provider.add_span_processor(processor)
    try:
        yield provider.get_tracer("tests.weave")
    finally:
        provider.force_flush(10_000)
        provider.shutdown()
