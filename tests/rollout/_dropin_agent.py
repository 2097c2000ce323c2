"""A verl-style tool agent written with otel_verl's drop-in API only: ``rollout_trace_attr`` around
an agent loop whose methods carry a bare ``@rollout_trace_op``, ``record_reward`` after the run,
no ``set_trajectory_input/output`` and no ``kind=`` (verl's documented way to add an agent type).
Its types are verl's pydantic models (``FunctionCall``, ``ToolResponse``, ``AgentLoopOutput``).

The same classes can also be traced the way verl's own weave backend does it (``MODE = "verl"``:
weave client ``create_call``/``finish_call`` inside ``weave.attributes``, as
``verl/utils/rollout_trace.py`` does), for the weave tier's parity test. The phoenix tier and the
weave tier both import this file (it needs only otel_verl and pydantic; weave only in verl mode).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pydantic

import otel_verl

#: "otel_verl" (otel_verl's drop-in API) or "verl" (verl's weave backend, emulated faithfully)
MODE: contextvars.ContextVar[str] = contextvars.ContextVar("dropin_mode", default="otel_verl")
EXPERIMENT = "exp-dropin"


def _verl_weave_op(fn: Any) -> Any:
    """verl 0.9's ``rollout_trace_op`` with ``backend="weave"`` (async methods)."""
    signature = inspect.signature(fn)

    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from weave.trace.context import call_context
        from weave.trace.context.weave_client_context import require_weave_client

        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        inputs = dict(bound.arguments)
        del inputs["self"]
        client = require_weave_client()
        call = client.create_call(op=fn.__qualname__, inputs=inputs,
                                  attributes={**call_context.call_attributes.get()})
        try:
            result = await fn(self, *args, **kwargs)
        except Exception as exc:
            client.finish_call(call, exception=exc)
            raise
        client.finish_call(call, output=result)
        return result

    return wrapper


def traced(fn: Any) -> Any:
    """Bare ``@rollout_trace_op`` (otel_verl mode) or verl's weave op (verl mode)."""
    ours, verls = otel_verl.rollout_trace_op(fn), _verl_weave_op(fn)

    @functools.wraps(fn)
    async def dispatch(*args: Any, **kwargs: Any) -> Any:
        return await (verls if MODE.get() == "verl" else ours)(*args, **kwargs)

    return dispatch


@contextlib.contextmanager
def trajectory(step: int, sample_index: int, rollout_n: int) -> Iterator[None]:
    """verl's ``rollout_trace_attr(..., name="agent_loop")`` in either mode."""
    if MODE.get() == "verl":
        import weave

        with weave.attributes({"sample_index": sample_index, "step": step,
                               "rollout_n": rollout_n, "validate": False,
                               "experiment_name": EXPERIMENT}):
            yield
        return
    with otel_verl.rollout_trace_attr(sample_index=sample_index, step=step, rollout_n=rollout_n,
                                      name="agent_loop"):
        yield


class FunctionCall(pydantic.BaseModel):  # verl.experimental.agent_loop.tool_parser
    name: str
    arguments: str


class ToolResponse(pydantic.BaseModel):  # verl.tools.schemas
    text: str | None = None


class AgentLoopOutput(pydantic.BaseModel):  # verl.experimental.agent_loop.agent_loop
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    num_turns: int = 0
    metrics: dict[str, Any] = {}


class CharTokenizer:
    """ids are code points; ``decode(ids)`` takes no ``skip_special_tokens`` (some don't)."""

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


class LLMServerClient:
    """Scripted model turns; verl's per-turn ``generate(request_id, *, prompt_ids, ...)``."""

    def __init__(self, tokenizer: CharTokenizer, script: list[str]) -> None:
        self.tokenizer, self.script = tokenizer, list(script)

    @traced
    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any]) -> dict[str, Any]:
        return {"token_ids": self.tokenizer.encode(self.script.pop(0)), "stop_reason": "stop"}


class HermesToolParser:
    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.tokenizer = tokenizer

    @traced
    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids)
        if "<tool_call>" not in text:
            return text, []
        body = json.loads(text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
        return "", [FunctionCall(name=body["name"], arguments=json.dumps(body["arguments"]))]


class CalcTool:
    @traced
    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        a, op, b = parameters["expression"].partition("+")
        return ToolResponse(text=str(int(a) + int(b))), 0.0, {}


class ToolAgentLoop:
    def __init__(self, script: list[str]) -> None:
        self.tokenizer = CharTokenizer()
        self.server = LLMServerClient(self.tokenizer, script)
        self.parser = HermesToolParser(self.tokenizer)
        self.tool = CalcTool()

    @traced
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt = self.tokenizer.encode(kwargs["raw_prompt"][-1]["content"])
        ids, response, mask, turns = list(prompt), [], [], 0
        while True:
            turns += 1
            out = await self.server.generate(f"req-{kwargs['index']}", prompt_ids=ids,
                                             sampling_params=sampling_params)
            ids += out["token_ids"]
            response += out["token_ids"]
            mask += [1] * len(out["token_ids"])
            _, calls = await self.parser.extract_tool_calls(out["token_ids"])
            if not calls:
                break
            turns += 1
            for call in calls:
                result, _, _ = await self.tool.execute(f"inst-{kwargs['index']}",
                                                       json.loads(call.arguments))
                tool_ids = self.tokenizer.encode(result.text or "")
                ids += tool_ids
                response += tool_ids
                mask += [0] * len(tool_ids)
        return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=mask,
                               num_turns=turns)


def tool_call(expression: str) -> str:
    return ('<tool_call>{"name": "calculator", "arguments": {"expression": "' + expression
            + '"}}</tool_call>')


@dataclass(frozen=True)
class Sample:
    step: int
    sample_index: int
    rollout_n: int
    question: str
    script: tuple[str, ...]
    reward: float

    @property
    def llm_turns(self) -> int:
        return len(self.script)

    @property
    def tool_calls(self) -> int:
        return sum("<tool_call>" in turn for turn in self.script)

    @property
    def spans(self) -> int:
        """trajectory + run + per turn (generate + extract_tool_calls) + per tool call execute"""
        return 2 + 2 * self.llm_turns + self.tool_calls


SAMPLES = (
    Sample(1, 0, 0, "What is 2 + 3?", (tool_call("2+3"), "The answer is 5."), 1.0),
    Sample(1, 0, 1, "What is 2 + 3?", ("The answer is 6.",), 0.0),
    Sample(1, 1, 0, "What is 4 + 4?", (tool_call("4+4"), "The answer is 8."), 1.0),
    Sample(2, 1, 0, "What is 4 + 4?", ("I do not know.",), 0.0),
)


async def run_sample(sample: Sample) -> AgentLoopOutput:
    """One trajectory as verl's ``AgentLoopWorker`` runs it (reward after the run)."""
    loop = ToolAgentLoop(list(sample.script))
    with trajectory(sample.step, sample.sample_index, sample.rollout_n):
        output = await loop.run({"temperature": 1.0},
                                raw_prompt=[{"role": "user", "content": sample.question}],
                                index=sample.sample_index)
        if MODE.get() == "otel_verl":
            otel_verl.record_reward(sample.reward)
    return output


async def run_all(samples: tuple[Sample, ...] = SAMPLES) -> list[AgentLoopOutput]:
    return [await run_sample(s) for s in samples]
