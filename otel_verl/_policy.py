"""Policy version: which weights sampled each LLM call (issue 22, docs/parity.md).

Usage (a trainer that is not verl: say which weights the rollout engine serves)::

    otel_verl.set_policy_version(step)      # after each weight sync; read by every LLM call span

Every LLM call span started afterwards carries ``rl.policy.version`` (read at span start: one
global read, O(1)); the trajectory span carries ``rl.policy.min_version`` / ``max_version`` over
its calls and ``rl.policy.staleness`` = ``rollout.step - 1 - min_version`` (a version counts the
weight updates in the weights; step k trains the weights of k - 1 updates, so 0 is on-policy;
not set on validation trajectories, which nothing trains on). The verl integration reads the
version from each reply of verl's rollout server instead (``global_steps`` of its last weight
sync), which wins over the process-wide value for that call.
"""

from __future__ import annotations

from typing import Any

from otel_verl import _errors, semconv
from otel_verl._state import TRAJECTORY

#: the version of the weights this process's LLM calls are served by (None: not said)
_VERSION: int | None = None


def set_policy_version(version: int | None) -> None:
    """Say which version of the policy's weights serves this process's LLM calls from now on.

    Args:
        version: the number of weight updates in the served weights (verl: ``global_steps`` at
            the last sync), or None to stop recording one.

    Raises:
        TypeError: ``version`` is not an int (or None).
    """
    global _VERSION
    if version is not None and (type(version) is not int):
        raise TypeError(f"set_policy_version takes an int or None, not {type(version).__name__}")
    _VERSION = version


def policy_version() -> int | None:
    """The version ``set_policy_version`` last set (None: none)."""
    return _VERSION


def start_attributes(attrs: dict[str, Any]) -> None:
    """At an LLM call span's start: the process-wide version into its attributes (O(1))."""
    version = _VERSION
    if version is not None:
        attrs[semconv.RL_POLICY_VERSION] = version
        note_trajectory(version)


def record(span: Any, version: Any) -> None:
    """An LLM call's version known from its reply (never raises; a non-int is ignored)."""
    if type(version) is not int or span is None:
        return
    try:
        span.set_attribute(semconv.RL_POLICY_VERSION, version)
        note_trajectory(version)
    except Exception as exc:
        _errors.internal_error(exc, "policy version")


def note_trajectory(version: int) -> None:
    """Widen the current trajectory's min/max version (and its staleness) to ``version``."""
    traj = TRAJECTORY.get()
    span = traj.span if traj is not None else None
    if span is None or not span.is_recording():
        return
    attrs = getattr(span, "attributes", None) or {}
    low, high = attrs.get(semconv.RL_POLICY_MIN_VERSION), attrs.get(semconv.RL_POLICY_MAX_VERSION)
    updates: dict[str, Any] = {}
    if type(low) is not int or version < low:
        updates[semconv.RL_POLICY_MIN_VERSION] = version
        step = traj.attrs.get(semconv.ROLLOUT_STEP) if traj is not None else None
        if type(step) is int and not traj.attrs.get(semconv.ROLLOUT_VALIDATE):  # type: ignore[union-attr]
            updates[semconv.RL_POLICY_STALENESS] = staleness(step, version)
    if type(high) is not int or version > high:
        updates[semconv.RL_POLICY_MAX_VERSION] = version
    if updates:
        span.set_attributes(updates)


def staleness(step: int, min_version: int) -> int:
    """Weight updates between the oldest sampling weights and those step ``step`` trains."""
    return step - 1 - min_version
