"""Tool-call parsers for model output (hermes format), traced like verl's ``extract_tool_calls``.

Usage::

    parser = HermesToolParser()
    content, calls = await parser.extract_tool_calls(text)

The hermes format is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of
times. A model (certainly a random tiny one) can write anything, so the parser never raises: a call
whose JSON is broken, whose ``name`` is missing, or whose ``arguments`` is not an object comes back
as a ``FunctionCall`` with ``error`` set; the agent loop turns those into error tool responses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import otel_verl

__all__ = ["FunctionCall", "HermesToolParser"]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNCLOSED = re.compile(r"<tool_call>(?!.*</tool_call>)(.*)\Z", re.DOTALL)


@dataclass
class FunctionCall:
    """One parsed call. ``error`` is set (and ``name`` may be empty) when it could not be parsed."""

    name: str
    arguments: dict[str, Any]
    raw: str
    error: str | None = None


class HermesToolParser:
    """Parses ``<tool_call>`` blocks; see the module docstring for the error rules."""

    start_token = "<tool_call>"
    end_token = "</tool_call>"

    @otel_verl.rollout_trace_op
    async def extract_tool_calls(self, text: str) -> tuple[str, list[FunctionCall]]:
        """Return (the text outside tool-call blocks, the calls in order)."""
        return self.parse(text)

    def parse(self, text: str) -> tuple[str, list[FunctionCall]]:
        """Untraced parse (the traced ``extract_tool_calls`` calls this)."""
        if self.start_token not in text:
            return text, []
        calls = [self._parse_one(m.group(1)) for m in _TOOL_CALL.finditer(text)]
        content = _TOOL_CALL.sub("", text)
        unclosed = _UNCLOSED.search(content)
        if unclosed is not None:  # cut off by max_tokens or a stray opener: report, don't guess
            calls.append(
                FunctionCall(
                    name="",
                    arguments={},
                    raw=unclosed.group(1),
                    error="unterminated <tool_call> block",
                )
            )
            content = content[: unclosed.start()]
        return content.strip(), calls

    @staticmethod
    def _parse_one(raw: str) -> FunctionCall:
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return FunctionCall(name="", arguments={}, raw=raw, error=f"invalid JSON: {exc}")
        if not isinstance(obj, dict):
            return FunctionCall(name="", arguments={}, raw=raw, error="tool call is not an object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return FunctionCall(name="", arguments={}, raw=raw, error="missing tool name")
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):  # some models double-encode the arguments
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        if not isinstance(arguments, dict):
            return FunctionCall(
                name=name, arguments={}, raw=raw, error="arguments must be a JSON object"
            )
        return FunctionCall(name=name, arguments=arguments, raw=raw)
