"""A verl tool written the way verl's own tools are (imported by verl's tool registry by name)."""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.utils.rollout_trace import rollout_trace_op


class CalculatorTool(BaseTool):
    """Evaluates ``a+b`` / ``a-b`` / ``a*b``; keeps per-instance state like verl's tools."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.instances: dict[str, Any] = {}
        self.released: list[str] = []

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id, **kwargs)
        self.instances[instance_id] = None
        return instance_id, response

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        expression = str(parameters.get("expression", ""))
        for op in "+-*":
            if op in expression:
                left, right = expression.split(op, 1)
                a, b = int(left), int(right)
                value = a + b if op == "+" else a - b if op == "-" else a * b
                self.instances[instance_id] = value
                return ToolResponse(text=str(value)), 0.0, {}
        return ToolResponse(text="error: unsupported expression"), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.instances.pop(instance_id, None)
        self.released.append(instance_id)
