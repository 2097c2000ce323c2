"""The instrumentation API: a drop-in for ``verl.utils.rollout_trace`` built on OpenTelemetry.

Usage::

    from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

    RolloutTraceConfig.init("my_project", "exp1", "file")   # or "otlp", "weave", "console", None

    class MyAgentLoop:
        @rollout_trace_op
        async def run(self, sampling_params, **kwargs): ...

    with rollout_trace_attr(step=3, sample_index=5, rollout_n=0):
        await loop.run(params, **row)

Configuration: see ``otel_verl._config`` (explicit > verl keys > environment > default).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_verl import _env, _errors, semconv
from otel_verl._config import TraceConfig, resolve_config
from otel_verl._payload import TRUNCATION_MARK, redact_text, to_payload
from otel_verl._provider import SCOPE_NAME, build_provider
from otel_verl._sampling import TrajectorySampler, normalise_index

_log = logging.getLogger("otel_verl")
F = TypeVar("F", bound=Callable[..., Any])
_UNSET: Any = object()
_W3C = TraceContextTextMapPropagator()
_NOOP_TRACER = otel_trace.NoOpTracer()


# --- process state ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Trajectory:
    """The current trajectory, held in a ContextVar (so it follows asyncio tasks)."""

    attrs: Mapping[str, Any]
    span: Span | None
    enabled: bool


_TRAJ: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar(
    "otel_verl_trajectory", default=None)


class _Runtime:
    """Everything built from one TraceConfig; exists only while tracing is on."""

    def __init__(self, config: TraceConfig, exporter: SpanExporter | None) -> None:
        self.config = config
        self.provider, self.exporter, self.processor = build_provider(
            config, _current_trajectory_attrs, exporter)
        self.tracer = self.provider.get_tracer(SCOPE_NAME)
        self.sampler = TrajectorySampler(config.max_samples_per_step_per_worker,
                                         config.experiment_name)

    def payload(self, value: Any, max_bytes: int | None = None) -> Any:
        return to_payload(value, max_bytes=max_bytes or self.config.max_field_bytes,
                          redact=self.config.redact)


_RUNTIME: _Runtime | None = None
_LOCK = threading.RLock()


def _current_trajectory_attrs() -> tuple[Mapping[str, Any], int | None] | None:
    traj = _TRAJ.get()
    if traj is None or not traj.enabled:
        return None
    return traj.attrs, (traj.span.get_span_context().span_id if traj.span is not None else None)


# --- RolloutTraceConfig --------------------------------------------------------------------------


class RolloutTraceConfig:
    """Process-wide tracing configuration with verl's interface (a singleton).

    Only the first ``init`` in a process takes effect, as in verl; ``reset()`` undoes it (tests).
    """

    _instance: RolloutTraceConfig | None = None

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.project_name = config.project_name
        self.experiment_name = config.experiment_name
        self.backend = config.backend if config.enabled else None
        self.token2text = config.token2text
        self.max_samples_per_step_per_worker = config.max_samples_per_step_per_worker
        self.client: SpanExporter | None = None

    @classmethod
    def get_instance(cls) -> RolloutTraceConfig:
        """The process's instance (an un-initialised, tracing-off one before ``init``)."""
        if cls._instance is None:
            return cls(dataclasses.replace(TraceConfig(), backend=None))
        return cls._instance

    @classmethod
    def init(
        cls,
        project_name: str | None = None,
        experiment_name: str | None = None,
        backend: str | None = _UNSET,
        token2text: bool = _UNSET,
        max_samples_per_step_per_worker: int | None = _UNSET,
        **otel_options: Any,
    ) -> None:
        """Initialise tracing for this process (only the first call takes effect).

        Args:
            project_name: verl's ``trainer.project_name`` (Weave project, resource attribute).
            experiment_name: verl's ``trainer.experiment_name`` (on every span).
            backend: ``file`` (default when omitted), ``otlp``, ``weave``, ``console``, ``none``;
                ``None`` or an unknown name turns tracing off, as in verl.
            token2text: add decoded ``prompt_text``/``response_text`` to traced outputs.
            max_samples_per_step_per_worker: N samples traced per step per worker; None = all.
            **otel_options: any ``TraceConfig`` field (``trace_dir``, ``otlp_endpoint``,
                ``otlp_protocol``, ``service_name``, ``max_field_bytes``, ``max_span_bytes``,
                ``redact``, ``processor``, ``spool_dir``, ``weave_entity``, ``weave_base_url``, ...),
                plus ``exporter`` (a SpanExporter replacing the backend's) and ``verl_config``
                (a verl config mapping or dotted overrides).

        Raises:
            ConfigError: a value is invalid (the message names the key and allowed values).
        """
        with _LOCK:
            if cls._instance is not None:
                return
            exporter = otel_options.pop("exporter", None)
            verl_config = otel_options.pop("verl_config", None)
            explicit = {k: v for k, v in otel_options.items() if v is not None}
            for key, value in (("project_name", project_name),
                               ("experiment_name", experiment_name)):
                if value is not None:
                    explicit[key] = value
            for key, value in (("backend", backend), ("token2text", token2text),
                               ("max_samples_per_step_per_worker",
                                max_samples_per_step_per_worker)):
                if value is not _UNSET:
                    explicit[key] = value
            config = resolve_config(explicit, verl_config)
            cls._install(config, exporter)

    @classmethod
    def _install(cls, config: TraceConfig, exporter: SpanExporter | None) -> None:
        global _RUNTIME
        instance = cls(config)
        if config.enabled:
            runtime = _Runtime(config, exporter)
            instance.client = runtime.exporter
            _RUNTIME = runtime
            _register_process_hooks()
        cls._instance = instance

    @classmethod
    def init_from_env(cls) -> bool:
        """In a worker process: initialise from ``export_env()``'s variables, if not done yet.

        Returns:
            True when tracing is on in this process afterwards.
        """
        with _LOCK:
            if cls._instance is None:
                if _env.OTEL_VERL_CONFIG not in os.environ:
                    return False
                cls._install(resolve_config(), None)
            return _RUNTIME is not None

    @classmethod
    def export_env(cls) -> dict[str, str]:
        """Environment variables that make a worker process build this configuration.

        Put them in a Ray ``runtime_env={"env_vars": ...}`` or a subprocess environment; the
        worker calls ``init_from_env()`` (``otel_verl.integrations.ray`` does it for you).
        """
        config = cls.get_instance().config
        # workers may start in another directory (Ray does): make local paths absolute
        config = dataclasses.replace(
            config, trace_dir=os.path.abspath(config.trace_dir),
            spool_dir=os.path.abspath(config.spool_dir) if config.spool_dir else None)
        if cls._instance is None:
            config = dataclasses.replace(config, backend="none")
        return {_env.OTEL_VERL_CONFIG: config.to_json()}

    @classmethod
    def get_backend(cls) -> str | None:
        return cls.get_instance().backend

    @classmethod
    def get_client(cls) -> SpanExporter | None:
        """The backend's exporter (verl returns its backend client here)."""
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls) -> bool:
        return cls.get_instance().token2text

    @classmethod
    def get_config(cls) -> TraceConfig:
        return cls.get_instance().config

    @classmethod
    def sampler(cls) -> TrajectorySampler:
        """The deterministic sampler for ``max_samples_per_step_per_worker``."""
        runtime = _RUNTIME
        if runtime is not None:
            return runtime.sampler
        config = cls.get_instance().config
        return TrajectorySampler(config.max_samples_per_step_per_worker, config.experiment_name)

    @classmethod
    def flush(cls, timeout_s: float = 5.0) -> bool:
        """Export everything finished so far; returns False if not done within ``timeout_s``."""
        runtime = _RUNTIME
        if runtime is None:
            return True
        return runtime.provider.force_flush(int(timeout_s * 1000))

    @classmethod
    def shutdown(cls, timeout_s: float = 5.0) -> bool:
        """Flush and stop exporting (bounded in time). Tracing is off afterwards."""
        global _RUNTIME
        with _LOCK:
            runtime, _RUNTIME = _RUNTIME, None
        if runtime is None:
            return True
        done = runtime.provider.force_flush(int(timeout_s * 1000 / 2))
        processor = runtime.processor
        stopper = getattr(processor, "shutdown")
        try:
            if "timeout_millis" in inspect.signature(stopper).parameters:
                stopper(timeout_millis=int(timeout_s * 1000 / 2))
            else:
                stopper()
        except Exception as exc:
            _errors.internal_error(exc, "shutdown")
            done = False
        _report_losses(runtime)
        return done

    @classmethod
    def stats(cls) -> dict[str, int]:
        """Delivery counts: queued, exported, export_failed, dropped_queue_full, spooled, ..."""
        runtime = _RUNTIME
        if runtime is None:
            return {}
        return _stats(runtime)

    @classmethod
    def reset(cls) -> None:
        """Shut tracing down and forget the configuration (for tests)."""
        cls.shutdown(timeout_s=2.0)
        with _LOCK:
            cls._instance = None


def _stats(runtime: _Runtime) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in (runtime.processor, runtime.exporter):
        stats = getattr(part, "stats", None)
        if callable(stats):
            counts.update(stats())
    return counts


def _report_losses(runtime: _Runtime) -> None:
    counts = _stats(runtime)
    lost = {k: v for k, v in counts.items()
            if k in ("dropped_queue_full", "export_failed", "abandoned_at_shutdown", "spool_failed")
            and v}
    if lost:
        _log.warning("otel_verl: not every span was delivered: %s%s", lost,
                     f" ({counts['spooled']} kept in the spool for replay)"
                     if counts.get("spooled") else "")


_HOOKS_REGISTERED = False


def _register_process_hooks() -> None:
    """Flush before fork and shut down at exit: registered once per process, whatever the
    number of init/reset cycles."""
    global _HOOKS_REGISTERED
    if _HOOKS_REGISTERED:
        return
    _HOOKS_REGISTERED = True
    atexit.register(_shutdown_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_flush_before_fork)


def _shutdown_at_exit() -> None:
    try:
        RolloutTraceConfig.shutdown(timeout_s=5.0)
    except Exception:  # interpreter teardown: never raise from atexit
        pass


def _flush_before_fork() -> None:
    runtime = _RUNTIME
    if runtime is not None:
        try:
            runtime.provider.force_flush(1000)
        except Exception:
            pass


# --- trajectories --------------------------------------------------------------------------------


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
            restored on exit, also after an exception.

    Yields:
        The trajectory span, or None when nothing is recorded.
    """
    runtime = _RUNTIME
    experiment = (runtime.config.experiment_name if runtime is not None
                  else RolloutTraceConfig.get_instance().experiment_name)
    attrs: dict[str, Any] = {}
    for key, value in ((semconv.ROLLOUT_STEP, step), (semconv.ROLLOUT_SAMPLE_INDEX, sample_index),
                       (semconv.ROLLOUT_ROLLOUT_N, rollout_n)):
        if value is not None:
            value = normalise_index(value)
            attrs[key] = value if isinstance(value, (int, str, float, bool)) else str(value)
    attrs[semconv.ROLLOUT_VALIDATE] = bool(validate)
    attrs[semconv.ROLLOUT_EXPERIMENT_NAME] = experiment
    if runtime is None or not trace:
        token = _TRAJ.set(_Trajectory(attrs, None, bool(trace)))
        try:
            yield None
        finally:
            _TRAJ.reset(token)
        return
    span = runtime.tracer.start_span(
        name, kind=SpanKind.INTERNAL,
        attributes={**attrs, semconv.OTEL_VERL_TRAJECTORY: True,
                    semconv.ROLLOUT_PROJECT_NAME: runtime.config.project_name,
                    semconv.OPENINFERENCE_SPAN_KIND: semconv.SpanKindName.AGENT})
    token = _TRAJ.set(_Trajectory(attrs, span, True))
    ctx_token = otel_context.attach(otel_trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        _record_failure(span, exc)
        raise
    finally:
        otel_context.detach(ctx_token)
        _TRAJ.reset(token)
        span.end()


def _record_failure(span: Span, exc: BaseException) -> None:
    """``record_exception`` + status ERROR, with the message and traceback scrubbed like payloads.

    Exception texts carry URLs with keys and server answers often enough that they go through
    the same redaction and caps as inputs and outputs.
    """
    try:
        if not span.is_recording():
            return
        kind = type(exc)
        type_name = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        message = scrub_text(str(exc))
        trace_text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
        span.add_event("exception", {
            "exception.type": type_name,
            "exception.message": message,
            "exception.stacktrace": scrub_text(trace_text),
            "exception.escaped": False,
        })
        span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {message}"[:1024]))
    except Exception as inner:
        _errors.internal_error(inner, "recording an exception")


def scrub_text(text: str, max_chars: int | None = None) -> str:
    """Redact key-like values (when redaction is on) and cap a free-text attribute value.

    For attributes outside ``input.value``/``output.value`` (tool arguments and results, error
    messages): the same rules, applied to plain text.
    """
    runtime = _RUNTIME
    config = runtime.config if runtime is not None else RolloutTraceConfig.get_instance().config
    if config.redact:
        text = redact_text(text)
    limit = max_chars if max_chars is not None else config.max_field_bytes
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)
    return text


def payload_json(value: Any) -> str:
    """``value`` as capped, redacted JSON text (never raises), for attributes such as
    ``gen_ai.tool.call.arguments``; the rules of ``input.value``."""
    runtime = _RUNTIME
    config = runtime.config if runtime is not None else RolloutTraceConfig.get_instance().config
    return to_payload(value, max_bytes=config.max_field_bytes, redact=config.redact).json


def is_recording() -> bool:
    """True when a span started now would be recorded (tracing on and not silenced)."""
    if _RUNTIME is None:
        return False
    traj = _TRAJ.get()
    return traj is None or traj.enabled


def get_tracer() -> otel_trace.Tracer:
    """otel_verl's tracer for hand-made spans (a no-op tracer when nothing would be recorded)."""
    runtime = _RUNTIME
    if runtime is None or not is_recording():
        return _NOOP_TRACER
    return runtime.tracer


def get_tracer_provider() -> TracerProvider | None:
    """otel_verl's provider (None while tracing is off); e.g. to share it with an in-process engine."""
    runtime = _RUNTIME
    return runtime.provider if runtime is not None else None


def current_trajectory_attributes() -> Mapping[str, Any]:
    """The trajectory attributes of the current context (empty outside a trajectory)."""
    traj = _TRAJ.get()
    return dict(traj.attrs) if traj is not None else {}


def set_payload(span: Span, *, input: Any = _UNSET, output: Any = _UNSET) -> None:
    """Serialise (never raises), cap, redact and set ``input.value``/``output.value`` on a span."""
    runtime = _RUNTIME
    if runtime is None or not runtime.config.capture_payloads or not span.is_recording():
        return
    try:
        existing = getattr(span, "attributes", None) or {}  # input and output arrive separately
        span.set_attributes(_payload_attrs(runtime, input, output, existing))
    except Exception as exc:
        _errors.internal_error(exc, "set_payload")


def _payload_attrs(runtime: _Runtime, input: Any, output: Any,
                   existing: Mapping[str, Any]) -> dict[str, Any]:
    config = runtime.config
    budget = config.max_span_bytes - len(existing.get(semconv.INPUT_VALUE, ""))
    attrs: dict[str, Any] = {}
    truncated: list[str] = []
    redacted = 0
    errors: list[str] = []
    for key, mime, value in ((semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, input),
                             (semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, output)):
        if value is _UNSET:
            continue
        payload = runtime.payload(value, min(config.max_field_bytes, max(256, budget)))
        budget -= len(payload.json)
        attrs[key] = payload.json
        attrs[mime] = semconv.MIME_JSON
        if payload.truncated:
            truncated.append(key)
        redacted += payload.redacted
        if payload.error:
            errors.append(payload.error)
    if truncated:
        attrs[semconv.OTEL_VERL_TRUNCATED] = [*existing.get(semconv.OTEL_VERL_TRUNCATED, ()),
                                              *truncated]
    if redacted:
        attrs[semconv.OTEL_VERL_REDACTED] = existing.get(semconv.OTEL_VERL_REDACTED, 0) + redacted
    if errors:
        attrs[semconv.OTEL_VERL_PAYLOAD_ERROR] = "; ".join(errors)[:1000]
    return attrs


def record_reward(score: float, *, name: str = "reward", label: str | None = None) -> None:
    """Put a reward on the current trajectory span (``rollout.reward`` + GenAI evaluation).

    Also emits a ``gen_ai.evaluation.result`` event there. Does nothing outside a recorded
    trajectory.
    """
    traj = _TRAJ.get()
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
    traj = _TRAJ.get()
    if traj is not None and traj.span is not None:
        traj.span.set_attribute(key, value)


# --- crossing processes ---------------------------------------------------------------------------


def traceparent_headers() -> dict[str, str]:
    """W3C ``traceparent``/``tracestate`` of the current span, for a request to an engine.

    Empty when nothing is recording (so engines start no orphan traces for untraced rollouts).
    """
    if not is_recording():
        return {}
    headers: dict[str, str] = {}
    _W3C.inject(headers)
    return headers


def inject_context(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """A carrier for another process: W3C trace context plus the trajectory attributes.

    Args:
        carrier: a dict to fill (a new one when None).

    Returns:
        The carrier; pass it along with the call and open ``use_context(carrier)`` there.
    """
    carrier = {} if carrier is None else carrier
    _W3C.inject(carrier)
    traj = _TRAJ.get()
    if traj is not None:
        carrier[semconv.CARRIER_TRAJECTORY] = json.dumps(
            {"attrs": dict(traj.attrs), "enabled": traj.enabled})
    return carrier


@contextlib.contextmanager
def use_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Continue the trace and trajectory of ``carrier`` (from ``inject_context``) in this process."""
    if not carrier:
        yield
        return
    ctx = _W3C.extract(dict(carrier))
    traj = None
    raw = carrier.get(semconv.CARRIER_TRAJECTORY)
    if raw:
        try:
            data = json.loads(raw)
            traj = _Trajectory(data.get("attrs") or {}, None, bool(data.get("enabled", True)))
        except (ValueError, AttributeError) as exc:
            _errors.internal_error(exc, "malformed trajectory carrier")
    ctx_token = otel_context.attach(ctx)
    traj_token = _TRAJ.set(traj) if traj is not None else None
    try:
        yield
    finally:
        if traj_token is not None:
            _TRAJ.reset(traj_token)
        otel_context.detach(ctx_token)


# --- rollout_trace_op ----------------------------------------------------------------------------


class _OpSpec:
    """What one decorated function needs at call time (picklable: no closures, no locks)."""

    __slots__ = ("fn", "name", "kind", "capture_input", "capture_output", "names", "has_self",
                 "defaults", "simple", "signature")

    def __init__(self, fn: Callable[..., Any], name: str | None, kind: str,
                 capture_input: bool, capture_output: bool) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "op"))
        self.kind = kind
        self.capture_input = capture_input
        self.capture_output = capture_output
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        params = list(self.signature.parameters.values()) if self.signature else []
        self.names = tuple(p.name for p in params)
        self.has_self = bool(params) and params[0].name in ("self", "cls")
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)

    def __getstate__(self) -> dict[str, Any]:
        return {slot: getattr(self, slot) for slot in self.__slots__ if slot != "signature"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        try:
            self.signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            self.signature = None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(self or None, inputs without self), like verl: defaults applied, **kwargs as one key."""
        if self.simple and len(args) <= len(self.names):
            inputs = dict(zip(self.names, args))
            inputs.update(kwargs)
            for key, value in self.defaults.items():
                inputs.setdefault(key, value)
        elif self.signature is not None:
            try:
                bound = self.signature.bind(*args, **kwargs)
                bound.apply_defaults()
                inputs = dict(bound.arguments)
            except TypeError:  # the call itself will raise the real error
                inputs = {"args": list(args), "kwargs": kwargs}
        else:
            inputs = {"args": list(args), "kwargs": kwargs}
        owner = None
        if self.has_self and self.names and self.names[0] in inputs:
            owner = inputs.pop(self.names[0])
        return owner, inputs


class _OpCall:
    """One recorded call of a traced function: start, then exactly one of ``end`` or ``fail``.

    The single core behind the four adapters (sync, async, generator, async generator). Every
    step that is otel_verl's own work is guarded: a bug here is logged, the user's call goes on.
    """

    __slots__ = ("spec", "runtime", "span", "owner", "token")

    def __init__(self, spec: _OpSpec, runtime: _Runtime, span: Span, owner: Any,
                 token: Any) -> None:
        self.spec, self.runtime, self.span, self.owner, self.token = (spec, runtime, span, owner,
                                                                      token)

    @classmethod
    def begin(cls, spec: _OpSpec, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> _OpCall | None:
        """Start the span (current from now on) and capture inputs; None when not recording."""
        runtime = _RUNTIME
        if runtime is None:
            return None
        traj = _TRAJ.get()
        if traj is not None and not traj.enabled:
            return None
        try:
            attrs: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: spec.kind}
            if traj is not None:
                attrs.update(traj.attrs)
                if traj.span is not None and otel_trace.get_current_span() is traj.span:
                    attrs[semconv.OTEL_VERL_TRAJECTORY_CHILD] = True
            owner = None
            if spec.capture_input and runtime.config.capture_payloads:
                owner, inputs = spec.bind(args, kwargs)
                attrs.update(_payload_attrs(runtime, inputs, _UNSET, {}))  # one pass, at start
            elif spec.has_self and args:
                owner = args[0]
            span = runtime.tracer.start_span(spec.name, attributes=attrs)
            token = otel_context.attach(otel_trace.set_span_in_context(span))
        except Exception as exc:
            _errors.internal_error(exc, f"starting span {spec.name}")
            return None
        return cls(spec, runtime, span, owner, token)

    def detach(self) -> None:
        """Stop being the current span (generators re-enter with ``step_context``)."""
        if self.token is not None:
            otel_context.detach(self.token)
            self.token = None

    def step_context(self) -> Any:
        """Make the span current for one step of a generator; detach the returned token."""
        return otel_context.attach(otel_trace.set_span_in_context(self.span))

    def wants_text(self) -> bool:
        config = self.runtime.config
        return (config.token2text and config.capture_payloads and self.spec.capture_output
                and getattr(self.owner, "tokenizer", None) is not None)

    def texts(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> dict[str, str] | None:
        """token2text: decoded prompt/response text (never raises)."""
        try:
            return _token_texts(self.owner, kwargs, output)
        except Exception as exc:
            _errors.internal_error(exc, f"token2text in {self.spec.name}")
            return None

    def end(self, output: Any, extra: Mapping[str, Any] | None = None) -> None:
        self.detach()
        try:
            if self.spec.capture_output:
                set_payload(self.span, output=dict(_as_dict(output), **extra) if extra else output)
            self.span.end()
        except Exception as exc:
            _errors.internal_error(exc, f"finishing span {self.spec.name}")

    def fail(self, exc: BaseException) -> None:
        self.detach()
        _record_failure(self.span, exc)
        self.span.end()


def _as_dict(output: Any) -> dict[str, Any]:
    if isinstance(output, Mapping):
        return dict(output)
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
    dump = getattr(output, "model_dump", None)
    if callable(dump):
        try:
            return dict(dump())
        except Exception:
            pass
    fields = getattr(output, "__dict__", None)
    if isinstance(fields, dict):
        return dict(fields)
    return {"output": output}


# token2text: decoded text of prompt/response ids, added to a copy of the traced output ---------

_TEXT_FIELDS = (("prompt_ids", "prompt_text"), ("response_ids", "response_text"),
                ("token_ids", "response_text"))


def _token_texts(owner: Any, kwargs: dict[str, Any], output: Any) -> dict[str, str] | None:
    decode = getattr(getattr(owner, "tokenizer", None), "decode", None)
    if decode is None:
        return None
    texts: dict[str, str] = {}
    source = _as_dict(output)
    if "prompt_ids" not in source and "prompt_ids" in kwargs:  # per-turn generate(prompt_ids=...)
        source = dict(source, prompt_ids=kwargs["prompt_ids"])
    for ids_key, text_key in _TEXT_FIELDS:
        ids = source.get(ids_key)
        if ids is not None and text_key not in texts:
            if hasattr(ids, "tolist"):
                ids = ids.tolist()
            texts[text_key] = decode(ids, skip_special_tokens=False)
    return texts or None


# the four adapters: only the shape of the call differs ------------------------------------------


def _sync_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.end(result, call.texts(args, kwargs, result) if call.wants_text() else None)
        return result

    return wrapper


def _async_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        extra = None
        if call.wants_text():  # decoding can take milliseconds: off the event loop's thread
            call.detach()
            extra = await asyncio.get_running_loop().run_in_executor(
                None, call.texts, args, kwargs, result)
        call.end(result, extra)
        return result

    return wrapper


_MAX_YIELDS_KEPT = 1000


def _gen_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:
            return (yield from fn(*args, **kwargs))
        call.detach()  # the span is current only while the generator's own code runs
        gen = fn(*args, **kwargs)
        items: list[Any] = []
        to_send: Any = None
        pending: BaseException | None = None
        while True:
            token = call.step_context()
            try:
                item = gen.throw(pending) if pending is not None else gen.send(to_send)
            except StopIteration as stop:
                otel_context.detach(token)
                call.end(items if stop.value is None else stop.value)
                return stop.value
            except BaseException as exc:
                otel_context.detach(token)
                call.fail(exc)
                raise
            otel_context.detach(token)
            pending = None
            if len(items) < _MAX_YIELDS_KEPT:
                items.append(item)
            try:
                to_send = yield item
            except GeneratorExit:
                gen.close()
                call.end(items)
                raise
            except BaseException as exc:  # thrown in by the caller: forward it to the generator
                pending, to_send = exc, None

    return wrapper


def _async_gen_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:
            async for item in fn(*args, **kwargs):
                yield item
            return
        call.detach()
        agen = fn(*args, **kwargs)
        items: list[Any] = []
        to_send: Any = None
        pending: BaseException | None = None
        while True:
            token = call.step_context()
            try:
                item = await (agen.athrow(pending) if pending is not None else
                              agen.asend(to_send))
            except StopAsyncIteration:
                otel_context.detach(token)
                call.end(items)
                return
            except BaseException as exc:
                otel_context.detach(token)
                call.fail(exc)
                raise
            otel_context.detach(token)
            pending = None
            if len(items) < _MAX_YIELDS_KEPT:
                items.append(item)
            try:
                to_send = yield item
            except GeneratorExit:
                await agen.aclose()
                call.end(items)
                raise
            except BaseException as exc:  # thrown in by the caller: forward it to the generator
                pending, to_send = exc, None

    return wrapper


@overload
def rollout_trace_op(func: F) -> F: ...


@overload
def rollout_trace_op(*, name: str | None = None, kind: str = semconv.SpanKindName.CHAIN,
                     capture_input: bool = True,
                     capture_output: bool = True) -> Callable[[F], F]: ...


def rollout_trace_op(func: Any = None, *, name: str | None = None,
                     kind: str = semconv.SpanKindName.CHAIN, capture_input: bool = True,
                     capture_output: bool = True) -> Any:
    """Trace a function or method as one span (sync, async, generator or async generator).

    Bare (``@rollout_trace_op``, as in verl) or with options.

    Args:
        func: the function (when used bare).
        name: the span name; default the function's ``__qualname__`` (e.g. ``ToolAgentLoop.run``).
        kind: the ``openinference.span.kind`` (``SpanKindName.LLM``, ``TOOL``, ...).
        capture_input: record the bound arguments (minus ``self``) as ``input.value``.
        capture_output: record the return value as ``output.value``.

    Returns:
        The wrapped function; with tracing off or silenced it calls straight through.
    """

    def decorate(fn: F) -> F:
        spec = _OpSpec(fn, name, kind, capture_input, capture_output)
        if inspect.isasyncgenfunction(fn):
            return _async_gen_wrapper(spec)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):
            return _async_wrapper(spec)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _gen_wrapper(spec)  # type: ignore[return-value]
        return _sync_wrapper(spec)  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate


def select_traced_samples(sample_indices: Iterable[Any]) -> frozenset:
    """Which sample indices of a worker's chunk to trace (``max_samples_per_step_per_worker``)."""
    return RolloutTraceConfig.sampler().select(sample_indices)

