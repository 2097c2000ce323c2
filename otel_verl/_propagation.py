"""Crossing processes: W3C trace context for engines, and a carrier that continues a trajectory.

Usage::

    headers = traceparent_headers()          # to an engine (vLLM, SGLang) with the request
    carrier = inject_context()               # to a Ray worker / subprocess with the call
    with use_context(carrier):               # there: same trace, same trajectory attributes
        ...

The propagators are OpenTelemetry's configured ones (``OTEL_PROPAGATORS``, W3C trace context and
baggage by default); the trajectory's attributes travel under ``semconv.CARRIER_TRAJECTORY``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate

from otel_verl import _errors, semconv
from otel_verl._hotpath import clean_attributes
from otel_verl._state import TRAJECTORY, Trajectory
from otel_verl._trajectory import is_recording


def traceparent_headers() -> dict[str, str]:
    """W3C ``traceparent``/``tracestate`` of the current span, for a request to an engine.

    Empty when nothing is recording (so engines start no orphan traces for untraced rollouts),
    and in a provisional trajectory (its engine spans could not be withdrawn if it is dropped).
    """
    if not is_recording():
        return {}
    traj = TRAJECTORY.get()
    if traj is not None and traj.provisional:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def inject_context(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """A carrier for another process: the trace context plus the trajectory attributes.

    Args:
        carrier: a dict to fill (a new one when None).

    Returns:
        The carrier; pass it along with the call and open ``use_context(carrier)`` there.
    """
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier)
    traj = TRAJECTORY.get()
    if traj is not None:
        carrier[semconv.CARRIER_TRAJECTORY] = json.dumps(
            {"attrs": dict(traj.attrs), "enabled": traj.enabled and not traj.provisional})
    return carrier


@contextlib.contextmanager
def use_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Continue the trace and trajectory of ``carrier`` (from ``inject_context``) in this process."""
    if not carrier:
        yield
        return
    ctx = propagate.extract(dict(carrier))
    traj = None
    raw = carrier.get(semconv.CARRIER_TRAJECTORY)
    if raw:
        try:
            data = json.loads(raw)
            traj = Trajectory(clean_attributes(data.get("attrs") or {}), None,
                              bool(data.get("enabled", True)))
        except (ValueError, AttributeError) as exc:
            _errors.internal_error(exc, "malformed trajectory carrier")
    ctx_token = otel_context.attach(ctx)
    traj_token = TRAJECTORY.set(traj) if traj is not None else None
    try:
        yield
    finally:
        if traj_token is not None:
            TRAJECTORY.reset(traj_token)
        otel_context.detach(ctx_token)
