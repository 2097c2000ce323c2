"""Trajectories: the span that marks one rollout, and what rollout code adds to it.

Usage::

    with rollout_trace_attr(step=3, sample_index=5, rollout_n=0):
        await loop.run(params, **row)          # every span inside carries the trajectory attrs
        record_reward(1.0, label="correct")    # on the trajectory span

``is_recording()`` and ``get_tracer()`` let hand-made spans follow the same rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind

from otel_verl import _errors, semconv
from otel_verl._capture import record_failure
from otel_verl._sampling import normalise_index, sampling_attributes
from otel_verl._state import STATE, TRAJECTORY, Trajectory

_NOOP_TRACER = otel_trace.NoOpTracer()


@contextlib.contextmanager
def rollout_trace_attr(
    sample_index: Any = None,
    step: int | None = None,
    rollout_n: int | None = None,
    name: str = "rollout_trace",
    validate: bool = False,
    trace: bool = True,
) -> Iterator[Span | None]:
    """Mark one trajectory: open its span and tag every span inside with its attributes.

    Args:
        sample_index: the dataset row (``extra_info.index``).
        step: the trainer's global step.
        rollout_n: which of the n repeats of the sample this is.
        name: the trajectory span's name (verl uses "agent_loop").
        validate: a validation rollout.
        trace: False silences every traced op inside (how per-sample sampling is applied);
            restored on exit, also after an exception. With ``tail_keep`` set, a ``trace=False``
            trajectory is recorded provisionally and exported only if a tail rule keeps it.

    Yields:
        The trajectory span, or None when nothing is recorded.
    """
    runtime = STATE.runtime
    attrs: dict[str, Any] = {}
    for key, value in ((semconv.ROLLOUT_STEP, step), (semconv.ROLLOUT_SAMPLE_INDEX, sample_index),
                       (semconv.ROLLOUT_ROLLOUT_N, rollout_n)):
        if value is not None:
            value = normalise_index(value)
            attrs[key] = value if isinstance(value, (int, str, float, bool)) else str(value)
    attrs[semconv.ROLLOUT_VALIDATE] = bool(validate)
    attrs[semconv.ROLLOUT_EXPERIMENT_NAME] = STATE.config.experiment_name
    provisional = not trace and runtime is not None and bool(runtime.config.tail_keep)
    if runtime is None or not (trace or provisional):
        token = TRAJECTORY.set(Trajectory(attrs, None, bool(trace)))
        try:
            yield None
        finally:
            TRAJECTORY.reset(token)
        return
    span = runtime.tracer.start_span(
        name, kind=SpanKind.INTERNAL,
        attributes={**attrs, semconv.OTEL_VERL_TRAJECTORY: True,
                    semconv.ROLLOUT_PROJECT_NAME: runtime.config.project_name,
                    semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.AGENT,
                    **sampling_attributes(runtime.sampler, sample_index, provisional)})
    token = TRAJECTORY.set(Trajectory(attrs, span, True, provisional))
    ctx_token = otel_context.attach(otel_trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        record_failure(span, exc)
        raise
    finally:
        otel_context.detach(ctx_token)
        TRAJECTORY.reset(token)
        span.end()


def is_recording() -> bool:
    """True when a span started now would be recorded (tracing on and not silenced)."""
    if STATE.runtime is None:
        return False
    traj = TRAJECTORY.get()
    return traj is None or traj.enabled


def get_tracer() -> otel_trace.Tracer:
    """otel_verl's tracer for hand-made spans (a no-op tracer when nothing would be recorded)."""
    runtime = STATE.runtime
    if runtime is None or not is_recording():
        return _NOOP_TRACER
    return runtime.tracer


def get_tracer_provider() -> TracerProvider | None:
    """otel_verl's provider (None while tracing is off); e.g. to share it with an in-process engine."""
    runtime = STATE.runtime
    return runtime.provider if runtime is not None else None


def record_reward(score: float, *, name: str = "reward", label: str | None = None) -> None:
    """Put a reward on the current trajectory span (``rollout.reward`` + GenAI evaluation).

    Also emits a ``gen_ai.evaluation.result`` event there. Does nothing outside a recorded
    trajectory.
    """
    traj = TRAJECTORY.get()
    if traj is None or traj.span is None or not traj.span.is_recording():
        return
    try:
        value = float(score)
        attrs: dict[str, Any] = {semconv.GEN_AI_EVALUATION_NAME: name,
                                 semconv.GEN_AI_EVALUATION_SCORE_VALUE: value}
        if label is not None:
            attrs[semconv.GEN_AI_EVALUATION_SCORE_LABEL] = label
        traj.span.set_attribute(semconv.ROLLOUT_REWARD, value)
        traj.span.add_event(semconv.GEN_AI_EVALUATION_RESULT, attrs)
    except Exception as exc:
        _errors.internal_error(exc, "record_reward")


def set_trajectory_attribute(key: str, value: Any) -> None:
    """Set an attribute on the current trajectory span (e.g. ``semconv.ROLLOUT_NUM_TURNS``)."""
    traj = TRAJECTORY.get()
    if traj is not None and traj.span is not None:
        traj.span.set_attribute(key, value)
