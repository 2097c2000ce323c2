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

from otel_verl.semconv import OTEL_VERL_TRAJECTORY_CHILD

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
    #: what the trajectory shows when it ends (``otel_verl._trajectory.Outcome``; recorded
    #: trajectories only; shared by reference with the asyncio tasks inside)
    outcome: Any = dataclasses.field(default=None, compare=False, repr=False)
    #: what ``current_trajectory_attrs`` returns, made once per trajectory (not once per span)
    tag: tuple[Mapping[str, Any], int | None, Mapping[str, Any]] | None = dataclasses.field(
        default=None, init=False, compare=False, repr=False)

    def make_tag(self) -> tuple[Mapping[str, Any], int | None, Mapping[str, Any]]:
        """``tag``, made at the first span that asks (tracing off makes none)."""
        span_id = self.span.get_span_context().span_id if self.span is not None else None
        tag = (self.attrs, span_id, {**self.attrs, OTEL_VERL_TRAJECTORY_CHILD: True})
        object.__setattr__(self, "tag", tag)
        return tag


TRAJECTORY: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar(
    "otel_verl_trajectory", default=None)


def current_trajectory_attrs(
) -> tuple[Mapping[str, Any], int | None, Mapping[str, Any]] | None:
    """(attributes, trajectory span id, the attributes of its direct children: the same plus
    ``otel_verl.trajectory_child``) of the current recorded trajectory, else None; the same
    tuple for every span of a trajectory."""
    traj = TRAJECTORY.get()
    if traj is None or not traj.enabled:
        return None
    tag = traj.tag
    return tag if tag is not None else traj.make_tag()
