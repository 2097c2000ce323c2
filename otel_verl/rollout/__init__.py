"""Traced async rollouts against real engines: agent loop, engine clients, tools, reward.

Usage::

    from otel_verl.rollout import ToolAgentLoop, VLLMCompletionsClient, CalculatorTool, Gsm8kReward

Names are imported lazily, so ``import otel_verl.rollout`` stays cheap. The demo's machinery
(vLLM server launcher, tiny-model builder, OTLP receiver) lives in ``otel_verl.demo``. See
``docs/rollout.md``.
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
