"""Trajectories: the span that marks one rollout, and what rollout code adds to it.

Usage::

    with rollout_trace_attr(step=3, sample_index=5, rollout_n=0):
        await loop.run(params, **row)          # every span inside carries the trajectory attrs
        record_reward(1.0, label="correct")    # on the trajectory span

``is_recording()`` and ``get_tracer()`` let hand-made spans follow the same rules.

What a viewer's list of traces shows for a trajectory (its root span): ``input.value`` = what the
agent loop names with ``set_trajectory_input`` (the prompt), ``output.value`` = the outcome
(``set_trajectory_output(answer=...)`` merged with the reward of ``record_reward``), written when
the trajectory ends, through the payload rules. When nothing sets them (verl's drop-in API:
``rollout_trace_attr`` + ``rollout_trace_op`` + ``record_reward``), they come from the agent
loop, the first top-level op of kind AGENT (verl's ``*.run``; else the first top-level op): the
input is its input, the output its output (else the last top-level op's) merged with the reward;
with neither set, ``otel_verl.trajectory_op`` names that op, so a backend with one row per
trajectory (Weave) can name the row after it. Every span inside also carries ``session.id`` (the
GRPO group: experiment, step, sample index, so a viewer groups the n rollouts of one prompt) and
``metadata`` (the trajectory attributes under verl's names, as JSON: Phoenix filters on
``metadata['step']``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind

from otel_verl import _errors, _evaluations, semconv
from otel_verl._capture import cap_text, record_failure, set_payload
from otel_verl._hotpath import attach_span, clean_attributes, start_span
from otel_verl._hotpath import detach as detach_context
from otel_verl._sampling import normalise_index, sampling_attributes
from otel_verl._state import STATE, TRAJECTORY, Trajectory
from otel_verl.exporters._scrub import fix_surrogates

_NOOP_TRACER = otel_trace.NoOpTracer()


class Outcome:
    """What the current trajectory shows when it ends: its outcome fields (answer, reward) and,
    for what nothing set, its top-level ops' payloads. Shared by reference with the asyncio tasks
    inside the trajectory; the top-level ops of ``_decorator`` write to it."""

    __slots__ = ("agent", "fields", "first_input", "first_op", "input_set", "last_output",
                 "output_set")

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.input_set = False
        self.output_set = False
        #: the agent loop: the first top-level op of kind AGENT (``*.run``), else the first one
        self.first_op: str | None = None
        self.agent = False
        #: its ``input.value`` (JSON text, already capped)
        self.first_input: str | None = None
        #: the ``output.value`` (JSON text, already capped) of the last top-level op to end (of
        #: the last AGENT op once there is one: a reward op after the run does not replace it)
        self.last_output: str | None = None

    def op_started(self, name: str, input_json: Any, agent: bool) -> None:
        if self.first_op is None or (agent and not self.agent):
            self.first_op, self.agent = name, agent
            self.first_input = input_json if type(input_json) is str else None

    def op_ended(self, output_json: Any, agent: bool) -> None:
        if type(output_json) is str and (agent or not self.agent):
            self.last_output = output_json


def current_outcome() -> Outcome | None:
    """The current recorded trajectory's ``Outcome`` (for its top-level ops); held by the
    trajectory itself (``Trajectory.outcome``: one context variable per trajectory, not two)."""
    traj = TRAJECTORY.get()
    return traj.outcome if traj is not None else None


#: ``metadata`` keys: verl's names for the trajectory attributes
_VERL_NAMES = {key: key.split(".", 1)[1] for key in semconv.TRAJECTORY_KEYS}


def session_id(attrs: Mapping[str, Any]) -> str | None:
    """The GRPO group of a trajectory: ``experiment/step-S/sample-I`` (``/validate`` appended for
    validation rollouts); None without a step and a sample index."""
    step = attrs.get(semconv.ROLLOUT_STEP)
    sample = attrs.get(semconv.ROLLOUT_SAMPLE_INDEX)
    if step is None or sample is None:
        return None
    sid = f"{attrs.get(semconv.ROLLOUT_EXPERIMENT_NAME)}/step-{step}/sample-{sample}"
    return sid + "/validate" if attrs.get(semconv.ROLLOUT_VALIDATE) else sid


_loads: Any = json.loads
try:  # the fast decoder (a core dependency; the stdlib json is the fallback)
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    pass

#: ``json.dumps(..., separators=(",", ":"), default=str)``, its encoder made once
_METADATA_JSON = json.JSONEncoder(separators=(",", ":"), default=str)


def _viewer_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``session.id`` and ``metadata`` derived from the trajectory attributes."""
    out: dict[str, Any] = {semconv.METADATA: _METADATA_JSON.encode(
        {_VERL_NAMES[k]: v for k, v in attrs.items() if k in _VERL_NAMES})}
    sid = session_id(attrs)
    if sid is not None:
        out[semconv.SESSION_ID] = sid
    return out


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
            attrs[key] = _index_attribute(value)
    attrs[semconv.ROLLOUT_VALIDATE] = validate if type(validate) is bool else _truth(validate)
    attrs[semconv.ROLLOUT_EXPERIMENT_NAME] = STATE.config.experiment_name
    attrs.update(_viewer_attrs(attrs))
    attrs = clean_attributes(attrs)  # validated once: every span inside gets them in one step
    enabled = trace if type(trace) is bool else _truth(trace)
    previous = TRAJECTORY.get()
    provisional = not enabled and runtime is not None and bool(runtime.config.tail_keep)
    if runtime is None or not (enabled or provisional):
        token = TRAJECTORY.set(Trajectory(attrs, None, enabled))
        live = runtime.live if runtime is not None else None  # counted, numbers only
        if live is not None:
            live.unsampled_started(attrs.get(semconv.ROLLOUT_STEP),
                                   attrs[semconv.ROLLOUT_VALIDATE])
        try:
            yield None
        finally:
            _restore(token, previous)
            if live is not None:
                live.unsampled_ended(attrs.get(semconv.ROLLOUT_STEP),
                                     attrs[semconv.ROLLOUT_VALIDATE])
        return
    name = fix_surrogates(name) if type(name) is str else "rollout_trace"
    span = start_span(  # a LightSpan (otel_verl._hotpath)
        runtime.tracer, name, SpanKind.INTERNAL,
        clean_attributes({**attrs, semconv.OTEL_VERL_TRAJECTORY: True,
                          semconv.ROLLOUT_PROJECT_NAME: runtime.config.project_name,
                          semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.AGENT,
                          **sampling_attributes(runtime.sampler,
                                                attrs.get(semconv.ROLLOUT_SAMPLE_INDEX),
                                                provisional)}))
    outcome = Outcome()
    token = TRAJECTORY.set(Trajectory(attrs, span, True, provisional, outcome=outcome))
    runtime.trajectory_started()
    previous_context = otel_context.get_current()
    ctx_token = attach_span(span)
    try:
        yield span
    except BaseException as exc:
        record_failure(span, exc)
        raise
    finally:
        if _restore(token, previous):
            detach_context(ctx_token)
        else:  # exited from another context: the tokens belong to the first one
            otel_context.attach(previous_context)
        _show_outcome(span, outcome)
        span.end()
        runtime.trajectory_ended()


def _show_outcome(span: Span, outcome: Outcome) -> None:
    """The trajectory's ``input.value``/``output.value`` at its end (never raises): what the code
    set, else what its agent loop op saw (see the module docstring), the output merged with the
    outcome fields (the reward)."""
    try:
        if not outcome.input_set and outcome.first_input is not None:
            span.set_attributes({semconv.INPUT_VALUE: outcome.first_input,
                                 semconv.INPUT_MIME_TYPE: semconv.MIME_JSON})
        if not outcome.input_set and not outcome.output_set and outcome.first_op is not None:
            span.set_attribute(semconv.OTEL_VERL_TRAJECTORY_OP, outcome.first_op)
        if outcome.output_set or outcome.last_output is None:
            if outcome.fields:
                set_payload(span, output=outcome.fields)
            return
        last = _loads(outcome.last_output)  # (our own rendered JSON: orjson reads it the same)
        merged = dict(last) if type(last) is dict else {"output": last}
        merged.update(outcome.fields)
        set_payload(span, output=merged)
    except Exception as exc:
        _errors.internal_error(exc, "trajectory input/output")


def _restore(token: Any, previous: Trajectory | None) -> bool:
    """Reset the trajectory variable; False when the exit happens in another context than the
    entry (a context manager entered in one task and left in another), where the previous value
    is set instead of raising ValueError into the rollout."""
    try:
        TRAJECTORY.reset(token)
        return True
    except ValueError:
        TRAJECTORY.set(previous)
        return False


def _index_attribute(value: Any) -> Any:
    """step / sample_index / rollout_n as an attribute value; never raises (an index whose
    ``item()`` or ``__str__`` raises is recorded by its type name)."""
    try:
        value = normalise_index(value)
        kind = type(value)
        if kind is int:
            return value if -(2**63) <= value < 2**63 else _big_int(value)
        if kind is str:
            return fix_surrogates(value)
        if kind is float or kind is bool:
            return value
        return fix_surrogates(str(value))[:256]
    except Exception:
        try:
            return f"<{type(value).__qualname__}>"
        except Exception:
            return "<index>"


def _big_int(value: int) -> str:
    bits = value.bit_length()
    return str(value) if bits <= 4096 else f"<int of {bits} bits>"


def _truth(value: Any) -> bool:
    try:
        return bool(value)
    except Exception:
        return True


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


def record_reward(score: float, *, name: str = "reward", label: str | None = None,
                  explanation: str | None = None,
                  components: Mapping[str, Any] | None = None) -> None:
    """Put a reward on the current trajectory span (``rollout.reward`` + GenAI evaluation).

    Also emits a ``gen_ai.evaluation.result`` event there (and a log-based event where wired,
    ``otel_verl._evaluations``). ``components``: name -> score, or -> ``{"score", "label",
    "explanation"}``, each its own evaluation result and ``rollout.reward.<name>`` attribute. Does
    nothing outside a recorded trajectory.
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
        if explanation is not None:
            attrs[semconv.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)[:1024]
        traj.span.set_attribute(semconv.ROLLOUT_REWARD, value)
        _evaluations.emit_evaluation(traj.span, attrs)
        if components:
            _evaluations.record_components(traj.span, components)
        outcome = current_outcome()
        if outcome is not None:
            outcome.fields["reward"] = value
            if label is not None:
                outcome.fields["reward_label"] = label
    except Exception as exc:
        _errors.internal_error(exc, "record_reward")


def set_trajectory_input(value: Any) -> None:
    """The trajectory span's ``input.value``: what a trace list shows as the trajectory's input.

    A string (e.g. the user's question) is kept as plain text (``text/plain``), anything else
    becomes JSON; both by the payload rules (caps, redaction, ``capture_payloads``). Does nothing
    outside a recorded trajectory. Without it, the trajectory's input is its agent loop op's.
    """
    traj = TRAJECTORY.get()
    if traj is None or traj.span is None or not traj.span.is_recording():
        return
    outcome = current_outcome()
    if outcome is not None:
        outcome.input_set = True
    if not isinstance(value, str):
        set_payload(traj.span, input=value)
        return
    runtime = STATE.runtime
    if runtime is not None and runtime.config.capture_payloads:
        # capped here, O(cap); its secrets are redacted on the export thread (``cap_text``)
        traj.span.set_attributes({semconv.INPUT_VALUE: cap_text(value),
                                  semconv.INPUT_MIME_TYPE: semconv.MIME_TEXT})


def set_trajectory_output(**fields: Any) -> None:
    """Merge ``fields`` (e.g. ``answer=...``) into the trajectory's outcome.

    The outcome (with the reward of ``record_reward``) becomes the trajectory span's
    ``output.value`` when the trajectory ends. Does nothing outside a recorded trajectory.
    Without it, the output is the agent loop op's output merged with the reward.
    """
    outcome = current_outcome()
    if outcome is not None:
        outcome.output_set = True
        outcome.fields.update(fields)


def set_trajectory_attribute(key: str, value: Any) -> None:
    """Set an attribute on the current trajectory span (e.g. ``semconv.ROLLOUT_NUM_TURNS``)."""
    traj = TRAJECTORY.get()
    if traj is not None and traj.span is not None:
        traj.span.set_attribute(key, value)
