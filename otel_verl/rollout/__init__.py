"""Traced async rollouts against real engines: agent loop, engine clients, tools, reward, demo.

Usage::

    from otel_verl.rollout import ToolAgentLoop, VLLMCompletionsClient, CalculatorTool, Gsm8kReward

Names are imported lazily, so ``import otel_verl.rollout`` stays cheap and the parts that need
heavy packages (``tiny_model``: torch/transformers; ``server``: a vLLM install to run) are only
loaded when used. See ``docs/rollout.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AgentLoopOutput": "agent_loop",
    "AgentState": "agent_loop",
    "ToolAgentLoop": "agent_loop",
    "AsyncLLMClient": "clients",
    "AsyncTokenClient": "clients",
    "ChatOutput": "clients",
    "EngineError": "clients",
    "OpenAIChatClient": "clients",
    "SGLangClient": "clients",
    "TokenOutput": "clients",
    "VLLMCompletionsClient": "clients",
    "VLLMGenerateClient": "clients",
    "FunctionCall": "parsers",
    "HermesToolParser": "parsers",
    "BaseTool": "tools",
    "CalculatorTool": "tools",
    "ToolResponse": "tools",
    "Gsm8kReward": "reward",
    "OTLPReceiver": "otlp_receiver",
    "VLLMServer": "server",
    "build_tiny_model": "tiny_model",
}

__all__ = tuple(sorted(_EXPORTS))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_verl.rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"otel_verl.rollout.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
