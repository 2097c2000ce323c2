"""Tools the agent loop can call, with verl's ``BaseTool`` shape and GenAI ``execute_tool`` spans.

Usage::

    from otel_verl.rollout.tools import CalculatorTool
    tool = CalculatorTool()
    response = await tool.execute("call_0", {"expression": "12*7"})
    response.text  # "84"

Every ``execute`` is a ``rollout_trace_op`` (span name ``BaseTool.execute``, as in verl) that also
carries the GenAI tool attributes: ``gen_ai.operation.name =
execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.type`` (``function``), ``gen_ai.tool.description``,
``gen_ai.tool.call.id`` and, when payloads are captured, ``gen_ai.tool.call.arguments`` and
``gen_ai.tool.call.result`` (through the payload caps and redaction).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from opentelemetry import trace

import otel_verl
from otel_verl import semconv
from otel_verl._capture import cap_text
from otel_verl.semconv import GenAIOperation, SpanKindName

__all__ = ["BaseTool", "CalculatorTool", "ToolResponse", "safe_eval"]


@dataclass
class ToolResponse:
    """What a tool returns: the text the model sees next, and an optional step reward."""

    text: str
    reward: float = 0.0
    ok: bool = True
    metrics: dict[str, Any] = field(default_factory=dict)


def _annotate_tool_span(name: str, description: str, call_id: str, arguments: Any,
                        result: str) -> None:
    """Put the GenAI ``execute_tool`` attributes on the current (op) span when it records."""
    if not otel_verl.is_recording():
        return
    span = trace.get_current_span()
    attrs = {
        semconv.GEN_AI_OPERATION_NAME: GenAIOperation.EXECUTE_TOOL,
        semconv.GEN_AI_TOOL_NAME: name,
        semconv.GEN_AI_TOOL_CALL_ID: call_id,
        semconv.GEN_AI_TOOL_TYPE: "function",
    }
    if description:
        attrs[semconv.GEN_AI_TOOL_DESCRIPTION] = description
    if otel_verl.RolloutTraceConfig.get_config().capture_payloads:  # content is opt-out
        # the caps of input.value/output.value; secrets in text are redacted on the export
        # thread (``cap_text``), key-named ones here (``payload_json``)
        attrs[semconv.GEN_AI_TOOL_CALL_ARGUMENTS] = (
            cap_text(arguments) if isinstance(arguments, str)
            else otel_verl.payload_json(arguments))
        attrs[semconv.GEN_AI_TOOL_CALL_RESULT] = cap_text(result)
    span.set_attributes(attrs)


class BaseTool:
    """A tool with an OpenAI function schema and an async ``execute``.

    Subclasses set ``name``/``description``/``parameters`` and implement ``_run``; ``execute``
    (the traced entry point) never raises: a failure becomes an error ``ToolResponse``.
    """

    name: str = "tool"
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool (what the chat template renders)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    async def _run(self, arguments: dict[str, Any]) -> ToolResponse:  # pragma: no cover
        raise NotImplementedError

    @otel_verl.rollout_trace_op(kind=SpanKindName.TOOL)
    async def execute(self, call_id: str, arguments: dict[str, Any]) -> ToolResponse:
        """Run the tool; errors become ``ToolResponse(ok=False)`` with the error text."""
        try:
            if not isinstance(arguments, dict):
                raise ValueError(f"arguments must be an object, got {type(arguments).__name__}")
            response = await self._run(arguments)
        except Exception as exc:  # a tool must never crash the rollout
            response = ToolResponse(text=f"Error: {exc}", ok=False)
        _annotate_tool_span(self.name, self.description, call_id, arguments, response.text)
        if not response.ok and otel_verl.is_recording():  # an error result (tail rule `errors`)
            trace.get_current_span().set_attribute(semconv.ERROR_TYPE, "tool_error")
        return response


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPRESSION_CHARS = 200
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 10**30


def _eval_node(node: ast.AST) -> int | float:
    """One node of ``safe_eval``'s tree (a module function: a recursive closure is a reference
    cycle per call, garbage that only the cyclic GC frees)."""
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast("int | float", node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return cast("int | float", _UNARY[type(node.op)](_eval_node(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError("exponent too large")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ValueError("division by zero") from exc
        if isinstance(value, complex) or abs(value) > _MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return cast("int | float", value)
    raise ValueError(f"unsupported element: {type(node).__name__}")


def safe_eval(expression: str) -> int | float:
    """Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses) without ``eval``.

    Raises ``ValueError`` for anything else (names, calls, attributes, huge powers, too long).
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _eval_node(tree)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not finite")
    return value


def format_number(value: float) -> str:
    """Render a result the way a GSM8K answer is written (``12``, ``2.5``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class CalculatorTool(BaseTool):
    """Safe arithmetic: ``{"expression": "12*7"}`` -> ``"84"``."""

    name = "calculator"
    description = "Evaluate an arithmetic expression with + - * / and parentheses."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
        "required": ["expression"],
    }

    async def _run(self, arguments: dict[str, Any]) -> ToolResponse:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ValueError("missing string argument 'expression'")
        return ToolResponse(text=format_number(safe_eval(expression)))
