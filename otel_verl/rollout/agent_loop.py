"""A traced multi-turn tool agent loop with verl's agent-loop contract.

Usage::

    loop = ToolAgentLoop(client, tokenizer, tools=[CalculatorTool()], reward_fn=Gsm8kReward())
    with otel_verl.rollout_trace_attr(step=1, sample_index=3, rollout_n=0):
        out = await loop.run({"temperature": 1.0, "max_tokens": 64},
                             raw_prompt=[{"role": "user", "content": "What is 12*7?"}],
                             reward_model={"ground_truth": "84"})
    out.response_ids, out.response_mask, out.reward_score, out.num_turns

State machine (verl's ``ToolAgentLoop``): GENERATING -> (parse tool calls) -> PROCESSING_TOOLS ->
GENERATING ... -> TERMINATED, on: no tool call in the model's turn, ``max_assistant_turns`` or
``max_user_turns`` reached, or the response reaching ``max_response_length`` tokens.

Spans (all inside the caller's trajectory): ``ToolAgentLoop.run`` -> per turn the client's
``generate`` (one span with the GenAI ``chat`` attributes, parent of the engine's request span) ->
``HermesToolParser.extract_tool_calls`` -> ``BaseTool.execute`` per call -> the reward
(``Gsm8kReward.compute_score``), computed inside ``run`` so the score is in the trace.
``run`` is the GenAI ``invoke_agent`` operation (``gen_ai.agent.name`` = ``agent_name``,
``gen_ai.conversation.id`` = the trajectory's request id, shared by its ``chat`` spans); the
span keeps verl's name so the Weave tree matches verl's. The trajectory span gets the user's
question (plain text) as its input and ``{"answer", "reward", "reward_label"}`` as its output, so a viewer's list of traces
reads each trajectory at a glance.

The tokenizer needs only ``apply_chat_template(messages, tools=..., add_generation_prompt=...,
tokenize=False)``, ``encode(text, add_special_tokens=False)``, ``decode(ids,
skip_special_tokens=...)`` and ``eos_token_id`` (any Hugging Face tokenizer has them).
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace

import otel_verl
from otel_verl import semconv
from otel_verl._hotpath import clean_attributes, merge_clean
from otel_verl.rollout.clients import TokenOutput, chat_messages
from otel_verl.rollout.parsers import FunctionCall, HermesToolParser
from otel_verl.rollout.tools import BaseTool, ToolResponse

__all__ = ["AgentLoopOutput", "AgentState", "ToolAgentLoop", "truncate_tool_text"]


class AgentState(enum.Enum):
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


class _Tokenizer(Protocol):
    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class _TokenClient(Protocol):
    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> TokenOutput: ...


#: ``turn_sampling(assistant_turn, messages, row) -> extra sampling params or None``; used by the
#: demo to force real tool-call text out of a random tiny model with structured outputs.
TurnSampling = Callable[[int, list[dict[str, Any]], Mapping[str, Any]], Mapping[str, Any] | None]


@dataclass
class AgentLoopOutput:
    """verl's ``AgentLoopOutput`` fields (plain lists, so it serialises and pickles cheaply)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)


def truncate_tool_text(text: str, max_length: int, side: str = "middle") -> str:
    """verl's truncation of tool output to ``max_length`` characters (``left|right|middle``)."""
    if max_length <= 0 or len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_length:]
    half = max_length // 2
    return text[:half] + "\n...(truncated)...\n" + text[len(text) - (max_length - half) :]


class ToolAgentLoop:
    """Multi-turn generation with hermes tool calls; see the module docstring.

    Args:
        client: a token-in/token-out client (``VLLMCompletionsClient``, ``SGLangClient``, ...).
        tokenizer: the model's tokenizer (chat template must render tool calls and results).
        tools: the tools the model may call (by ``tool.name``).
        reward_fn: object with ``async compute_score(solution_str, ground_truth) -> float``.
        max_assistant_turns / max_user_turns: turn limits (tool-response turns count as user).
        max_response_length: token budget for the whole response (model + tool tokens).
        max_tool_response_length / tool_response_truncate_side: tool text truncation.
        max_parallel_calls: tool calls executed per turn (the rest are dropped, like verl).
        turn_sampling: optional per-turn extra sampling parameters (see ``TurnSampling``).
        agent_name: ``gen_ai.agent.name`` of the ``run`` span (default: the class name).
    """

    def __init__(
        self,
        client: _TokenClient,
        tokenizer: _Tokenizer,
        *,
        tools: Sequence[BaseTool] = (),
        reward_fn: Any = None,
        tool_parser: HermesToolParser | None = None,
        max_assistant_turns: int = 4,
        max_user_turns: int = 4,
        max_response_length: int = 512,
        max_tool_response_length: int = 256,
        tool_response_truncate_side: str = "middle",
        max_parallel_calls: int = 1,
        turn_sampling: TurnSampling | None = None,
        agent_name: str | None = None,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.tools = {tool.name: tool for tool in tools}
        self.tool_schemas = [tool.schema() for tool in tools]
        self.reward_fn = reward_fn
        self.tool_parser = tool_parser or HermesToolParser()
        self.max_assistant_turns = max_assistant_turns
        self.max_user_turns = max_user_turns
        self.max_response_length = max_response_length
        self.max_tool_response_length = max_tool_response_length
        self.tool_response_truncate_side = tool_response_truncate_side
        self.max_parallel_calls = max(1, max_parallel_calls)
        self.turn_sampling = turn_sampling
        self.agent_name = agent_name or type(self).__name__

    # -- tokenizer helpers ------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], tools: Any) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _tool_turn_ids(self, last_token: int | None, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Tokens between the model's turn and its next turn: [eos] + "\\n" + tool turn + prompt."""
        ids: list[int] = []
        eos = self.tokenizer.eos_token_id
        if eos is not None and last_token != eos:
            ids.append(eos)  # the turn was cut (length): close it as the template would
        ids += self.tokenizer.encode("\n", add_special_tokens=False)
        return ids + self._render(tool_messages, None)

    # -- the loop -------------------------------------------------------------------------------
    @otel_verl.rollout_trace_op(kind=semconv.SpanKindName.CHAIN)  # the trajectory is the AGENT
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Roll out one trajectory for the dataset row ``kwargs`` (verl's row keys)."""
        messages: list[dict[str, Any]] = [dict(m) for m in kwargs["raw_prompt"]]
        request_id = uuid.uuid4().hex
        prompt_ids = self._render(messages, self.tool_schemas or None)
        response_ids: list[int] = []
        # the engine's prompt (prompt + response so far), extended in place as verl's
        # ``agent_data.prompt_ids`` is: never rebuilt per turn, so a turn allocates only what
        # it adds (a fresh context-long list per turn is what each young GC collection scans)
        context_ids = list(prompt_ids)
        response_mask: list[int] = []
        logprobs: list[float] | None = [] if sampling_params.get("logprobs") else None
        assistant_turns = user_turns = 0
        tool_calls = tool_errors = 0
        tool_rewards: list[float] = []
        t_generate = t_tools = 0.0
        termination = ""
        pending: list[FunctionCall] = []
        state = AgentState.GENERATING
        self._annotate_agent_span(request_id)
        otel_verl.set_trajectory_input(_prompt_text(messages))  # the root row's input

        while state is not AgentState.TERMINATED:
            if state is AgentState.GENERATING:
                budget = self.max_response_length - len(response_ids)
                sp = dict(sampling_params)
                sp["max_tokens"] = min(int(sp.get("max_tokens", budget)), budget)
                if self.turn_sampling is not None:
                    sp.update(self.turn_sampling(assistant_turns, messages, kwargs) or {})
                t0 = time.perf_counter()
                with chat_messages(list(messages)):
                    out = await self.client.generate(
                        request_id, prompt_ids=context_ids, sampling_params=sp
                    )
                t_generate += time.perf_counter() - t0
                assistant_turns += 1
                new_ids = list(out.token_ids)[:budget]
                response_ids += new_ids
                context_ids += new_ids
                response_mask += [1] * len(new_ids)
                if logprobs is not None:
                    got = list(out.log_probs or [])[: len(new_ids)]
                    logprobs += got + [0.0] * (len(new_ids) - len(got))
                text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
                content, pending = await self.tool_parser.extract_tool_calls(text)
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if pending:
                    message["tool_calls"] = [
                        {
                            "id": f"call_{user_turns}_{i}",
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for i, c in enumerate(pending[: self.max_parallel_calls])
                    ]
                messages.append(message)
                if len(response_ids) >= self.max_response_length:
                    termination = "response_length"
                elif assistant_turns >= self.max_assistant_turns:
                    termination = "max_assistant_turns"
                elif user_turns >= self.max_user_turns:
                    termination = "max_user_turns"
                elif not pending:
                    termination = "no_tool_call"
                state = AgentState.TERMINATED if termination else AgentState.PROCESSING_TOOLS

            elif state is AgentState.PROCESSING_TOOLS:
                calls = pending[: self.max_parallel_calls]
                t0 = time.perf_counter()
                tool_messages = []
                for i, call in enumerate(calls):
                    call_id = f"call_{user_turns}_{i}"
                    response = await self._call_tool(call, call_id)
                    tool_calls += 1
                    tool_errors += 0 if response.ok else 1
                    tool_rewards.append(response.reward)
                    tool_messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call_id,
                            "content": truncate_tool_text(
                                response.text,
                                self.max_tool_response_length,
                                self.tool_response_truncate_side,
                            ),
                        }
                    )
                t_tools += time.perf_counter() - t0
                messages.extend(tool_messages)
                last = response_ids[-1] if response_ids else None
                tool_ids = self._tool_turn_ids(last, tool_messages)
                if len(response_ids) + len(tool_ids) >= self.max_response_length:
                    termination = "response_length"
                    state = AgentState.TERMINATED
                    continue
                response_ids += tool_ids
                context_ids += tool_ids
                response_mask += [0] * len(tool_ids)
                if logprobs is not None:
                    logprobs += [0.0] * len(tool_ids)
                user_turns += 1
                state = AgentState.GENERATING

        answer = next((m.get("content") for m in reversed(messages)
                       if m.get("role") == "assistant"), None)
        otel_verl.set_trajectory_output(answer=answer)  # + the reward, when it is recorded
        reward_score = None
        t_reward = 0.0
        ground_truth = _ground_truth(kwargs)
        if self.reward_fn is not None and ground_truth is not None:
            t0 = time.perf_counter()
            solution = self.tokenizer.decode(response_ids, skip_special_tokens=True)
            reward_score = float(await self.reward_fn.compute_score(solution, ground_truth))
            t_reward = time.perf_counter() - t0

        num_turns = assistant_turns + user_turns + 1
        otel_verl.set_trajectory_attribute(semconv.ROLLOUT_NUM_TURNS, num_turns)
        otel_verl.set_trajectory_attribute(semconv.ROLLOUT_TERMINATION, termination)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=logprobs,
            reward_score=reward_score,
            num_turns=num_turns,
            metrics={
                "generate_sequences": t_generate,
                "tool_calls": t_tools,
                "compute_score": t_reward,
            },
            extra_fields={
                "termination": termination,
                "assistant_turns": assistant_turns,
                "user_turns": user_turns,
                "num_tool_calls": tool_calls,
                "num_tool_errors": tool_errors,
                "tool_rewards": tool_rewards,
                "messages": messages,
            },
        )

    def _annotate_agent_span(self, conversation_id: str) -> None:
        """The GenAI ``invoke_agent`` attributes on ``run``'s span (when it records)."""
        if not otel_verl.is_recording():
            return
        span = trace.get_current_span()
        attrs: dict[str, Any] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.GenAIOperation.INVOKE_AGENT,
            semconv.GEN_AI_AGENT_NAME: self.agent_name,
            semconv.GEN_AI_CONVERSATION_ID: conversation_id,
        }
        provider = getattr(self.client, "provider", None)
        model = getattr(self.client, "model", None)
        if isinstance(provider, str):
            attrs[semconv.GEN_AI_PROVIDER_NAME] = provider
        if isinstance(model, str):
            attrs[semconv.GEN_AI_REQUEST_MODEL] = model
        merge_clean(span, clean_attributes(attrs))  # one insert, validated once (``_hotpath``)
        otel_verl.set_trajectory_attribute(semconv.GEN_AI_CONVERSATION_ID, conversation_id)

    async def _call_tool(self, call: FunctionCall, call_id: str) -> ToolResponse:
        """Run one parsed call; parse errors and unknown tools become error responses."""
        if call.error is not None:
            return ToolResponse(text=f"Error: invalid tool call ({call.error})", ok=False)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResponse(
                text=f"Error: unknown tool {call.name!r} (available: {known})", ok=False
            )
        return await tool.execute(call_id, call.arguments)


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> Any:
    """The question a trace list shows for a trajectory: the last user message's text (the whole
    message list when there is no plain-text user message)."""
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return [dict(m) for m in messages]


def _ground_truth(row: Mapping[str, Any]) -> str | None:
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        return str(reward_model["ground_truth"])
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and extra.get("ground_truth") is not None:
        return str(extra["ground_truth"])
    return None
