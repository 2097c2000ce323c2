"""The current trajectory: a ContextVar (``TRAJECTORY``), so it follows asyncio tasks.

Its own module so that what reads it (the live tracker, the evaluation events, the trajectory
attributes processor) needs nothing of the process state that builds the pipeline
(``otel_verl._state``, which re-exports these names).
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span

__all__ = ["TRAJECTORY", "Trajectory", "current_trajectory_attrs"]


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """The current trajectory, held in a ContextVar (so it follows asyncio tasks)."""

    attrs: Mapping[str, Any]
    span: Span | None
    enabled: bool
    #: recorded only until the tail decision (``trace=False`` with ``tail_keep`` set)
    provisional: bool = False
    #: per-turn content chains by input field (``otel_verl._content``; mutable, per trajectory)
    content: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


TRAJECTORY: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar(
    "otel_verl_trajectory", default=None)


def current_trajectory_attrs() -> tuple[Mapping[str, Any], int | None] | None:
    """(attributes, trajectory span id) of the current recorded trajectory, else None."""
    traj = TRAJECTORY.get()
    if traj is None or not traj.enabled:
        return None
    return traj.attrs, (traj.span.get_span_context().span_id if traj.span is not None else None)
