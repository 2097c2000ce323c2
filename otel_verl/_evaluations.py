"""Rewards as GenAI evaluation results: span events always, log-based events when wired.

A reward, or one of its components (correctness, format, a tool's reward), is a
``gen_ai.evaluation.result``: a span event on the span it evaluates (Weave, Jaeger and every
span-only backend read these), and, where a ``LoggerProvider`` is set (``set_logger_provider``;
``otel_verl._provider`` sets one for ``backend=otlp`` when the SDK has the Logs API and the OTLP
log exporter is installed), also a log record with ``event_name="gen_ai.evaluation.result"`` in
that span's context (OTEP 4430: events move to logs; OpenTelemetry Python 1.44 dropped the
Events API).

Usage::

    record_reward(1.2, name="verifier", components={
        "correctness": 1.0, "format": {"score": 0.2, "label": "ok", "explanation": "#### found"}})
    # inside a tool call: the tool's reward, on that turn's span and linked from the trajectory
    record_reward_component("tool_reward", 0.1, turn=True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import SpanProcessor

from otel_verl import _errors, semconv
from otel_verl._current import TRAJECTORY
from otel_verl._env import OTEL_LOGS_EXPORTER

__all__ = ["emit_evaluation", "evaluation_attributes", "record_components",
           "record_reward_component", "set_logger_provider"]

_LOGGER: list[Any] = [None]  # the logs API logger, None: span events only


def set_logger_provider(provider: Any) -> None:
    """Also emit evaluations as log-based events through ``provider`` (None: stop)."""
    _LOGGER[0] = None if provider is None else provider.get_logger("otel_verl")


def logger_provider_for(exporter: Any) -> Any:
    """A ``LoggerProvider`` batching to ``exporter``, or None when the SDK has no Logs API."""
    try:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    except ImportError:
        return None
    provider = LoggerProvider()
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return provider


def evaluation_attributes(name: str, score: float | None, label: str | None = None,
                          explanation: str | None = None) -> dict[str, Any]:
    """The ``gen_ai.evaluation.*`` attributes of one result."""
    attrs: dict[str, Any] = {semconv.GEN_AI_EVALUATION_NAME: str(name)}
    if score is not None:
        attrs[semconv.GEN_AI_EVALUATION_SCORE_VALUE] = float(score)
    if label is not None:
        attrs[semconv.GEN_AI_EVALUATION_SCORE_LABEL] = str(label)
    if explanation is not None:
        attrs[semconv.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)[:1024]
    return attrs


def emit_evaluation(span: otel_trace.Span, attributes: Mapping[str, Any]) -> None:
    """The result as an event on ``span`` and, when a logger is set, as a log-based event in
    ``span``'s context (so a backend links it to the span it evaluates)."""
    span.add_event(semconv.GEN_AI_EVALUATION_RESULT, dict(attributes))
    logger = _LOGGER[0]
    if logger is not None:
        logger.emit(event_name=semconv.GEN_AI_EVALUATION_RESULT,
                    context=otel_trace.set_span_in_context(span), attributes=dict(attributes))


ComponentValue = float | Mapping[str, Any]


def _component(name: str, value: ComponentValue) -> tuple[float | None, str | None, str | None]:
    if isinstance(value, Mapping):
        score = value.get("score")
        label, explanation = value.get("label"), value.get("explanation")
        return (None if score is None else float(score),
                None if label is None else str(label),
                None if explanation is None else str(explanation))
    return float(value), None, None


def record_components(span: otel_trace.Span, components: Mapping[str, ComponentValue]) -> None:
    """Each component on the trajectory ``span``: an evaluation result and ``rollout.reward.<name>``
    (+ ``.label``) attributes (what Weave and Phoenix filter on)."""
    for name, value in components.items():
        score, label, explanation = _component(str(name), value)
        _record(span, str(name), score, label, explanation, None)


def _record(span: otel_trace.Span, name: str, score: float | None, label: str | None,
            explanation: str | None, turn: otel_trace.Span | None) -> None:
    attrs = evaluation_attributes(name, score, label, explanation)
    target = turn if turn is not None else span
    if score is not None:
        target.set_attribute(semconv.RL_REWARD_PREFIX + name, score)
    if label is not None:
        target.set_attribute(semconv.RL_REWARD_PREFIX + name + semconv.RL_REWARD_LABEL_SUFFIX,
                             label)
    if turn is not None:  # on the turn that earned it, and linked from the trajectory
        emit_evaluation(turn, attrs)
        attrs = {**attrs, semconv.OTEL_VERL_EVALUATED_SPAN_ID:
                 format(turn.get_span_context().span_id, "016x")}
    emit_evaluation(span, attrs)


def record_reward_component(name: str, score: float, *, label: str | None = None,
                            explanation: str | None = None, turn: bool = False) -> None:
    """One component of the current trajectory's reward (correctness, format, a tool's reward).

    Args:
        name: the component (``correctness``, ``format``, ``tool_use``, ...).
        score: its score.
        label: e.g. ``correct`` / ``format_error``.
        explanation: why, in a sentence.
        turn: the current span (a tool call, a model turn) earned it: the result goes on that
            span too, and the trajectory's copy names it (``otel_verl.evaluation.span_id``).

    Does nothing outside a recorded trajectory.
    """
    traj = TRAJECTORY.get()
    if traj is None or traj.span is None or not traj.span.is_recording():
        return
    try:
        current = otel_trace.get_current_span() if turn else None
        if current is not None and (current is traj.span or not current.is_recording()):
            current = None
        _record(traj.span, str(name), float(score), label, explanation, current)
    except Exception as exc:
        _errors.internal_error(exc, "record_reward_component")


class _LogsLifecycle(SpanProcessor):
    """Flushes and shuts down the evaluations' ``LoggerProvider`` with the tracer provider (a
    span processor that does nothing with spans)."""

    def __init__(self, logger_provider: Any) -> None:
        self.logger_provider = logger_provider

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: Any) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.logger_provider.force_flush(timeout_millis))

    def shutdown(self) -> None:
        if _LOGGER[0] is not None:
            set_logger_provider(None)
        self.logger_provider.shutdown()


def otlp_logs(config: Any) -> _LogsLifecycle | None:
    """``backend=otlp`` with ``OTEL_LOGS_EXPORTER=otlp``: evaluations also as log-based events to
    the same collector (OTLP logs, ``/v1/logs`` over HTTP), when the SDK has the Logs API and the
    OTLP log exporter is installed; else None (span events only). Returns the processor to add to
    the tracer provider."""
    if os.environ.get(OTEL_LOGS_EXPORTER, "").split(",")[0].strip().lower() != "otlp":
        return None  # a collector that has no logs pipeline (Phoenix: 405) is not asked
    exporter_class: Any
    try:
        if config.otlp_protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc import _log_exporter as grpc_logs

            exporter_class = grpc_logs.OTLPLogExporter
        else:
            from opentelemetry.exporter.otlp.proto.http import _log_exporter as http_logs

            exporter_class = http_logs.OTLPLogExporter
    except ImportError:
        return None
    kwargs: dict[str, Any] = {}
    if config.otlp_endpoint:
        from otel_verl.exporters import _otlp_endpoint

        endpoint, user, password = _otlp_endpoint.split_userinfo(config.otlp_endpoint)
        if user is not None:  # credentials in the URL: the traces path handles them; not here
            return None
        kwargs["endpoint"] = endpoint if config.otlp_protocol == "grpc" else \
            _otlp_endpoint.join_signal_path(endpoint, "/v1/logs")
        if config.otlp_protocol == "grpc":
            kwargs["insecure"] = not endpoint.startswith("https://")
    provider = logger_provider_for(exporter_class(timeout=config.export_timeout_s, **kwargs))
    if provider is None:
        return None
    set_logger_provider(provider)
    return _LogsLifecycle(provider)
