"""verl's tools: ``BaseTool.execute`` (verl's op) gets GenAI tool attributes; ``BaseTool.create`` /
``BaseTool.release`` of ``BaseTool`` and of every subclass (existing ones, and later ones through
``BaseTool.__init_subclass__``) get TOOL spans, which verl does not trace."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import otel_verl
from otel_verl import semconv
from otel_verl.integrations.verl._common import (
    LOCK,
    MARK,
    S,
    current_span,
    for_each_subclass,
    set_attr,
)
from otel_verl.semconv import GenAIOperation, SpanKindName

BASE_TOOL_MODULE = "verl.tools.base_tool"

#: the tool lifecycle step running now, so ``super().create(...)`` inside a subclass's ``create``
#: does not open a second span
_TOOL_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "otel_verl_verl_tool_step", default=None)


def _tool_attrs(owner: Any, operation: str | None) -> None:
    span = current_span()
    if span is None:
        return
    name = getattr(owner, "name", None)
    if isinstance(name, str):
        span.set_attribute(semconv.GEN_AI_TOOL_NAME, name)
    if operation is not None:
        span.set_attribute(semconv.GEN_AI_OPERATION_NAME, operation)


def execute_before(owner: Any, kwargs: dict[str, Any]) -> None:
    """Inside verl's ``BaseTool.execute`` op span: the tool's name and the GenAI operation."""
    _tool_attrs(owner, GenAIOperation.EXECUTE_TOOL)


def _lifecycle_before(owner: Any, kwargs: dict[str, Any]) -> None:
    _tool_attrs(owner, None)


def _lifecycle(func: Callable[..., Any], step: str) -> Callable[..., Any]:
    traced = otel_verl.rollout_trace_op(func, name=func.__qualname__, kind=SpanKindName.TOOL,
                                        before=_lifecycle_before)

    @functools.wraps(func)
    async def lifecycle(*args: Any, **kwargs: Any) -> Any:
        if _TOOL_STEP.get() == step:  # super().create() from a subclass's create: one span
            return await func(*args, **kwargs)
        token = _TOOL_STEP.set(step)
        try:
            return await traced(*args, **kwargs)
        finally:
            _TOOL_STEP.reset(token)

    setattr(lifecycle, MARK, True)
    return lifecycle


def _wrap_tool_lifecycle(cls: type) -> None:
    for name in ("create", "release"):
        func = cls.__dict__.get(name)
        if not inspect.iscoroutinefunction(func) or getattr(func, MARK, False):
            continue
        set_attr(cls, name, _lifecycle(func, name))


def patch_base_tool(module: ModuleType) -> None:
    """Post-import hook of ``verl.tools.base_tool``."""
    with LOCK:
        base = getattr(module, "BaseTool", None)
        if not S.installed or base is None or getattr(base, MARK, False):
            return
        _wrap_tool_lifecycle(base)
        for_each_subclass(base, _wrap_tool_lifecycle, "tool span wrapping")
        set_attr(base, MARK, True)
