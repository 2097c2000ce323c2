"""Build otel_verl's own TracerProvider from a TraceConfig.

The provider is never installed as the global one: an application's (or ``weave.init``'s) global
provider is left alone, and otel_verl's spans still join the current trace through the shared
context.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from otel_verl import semconv
from otel_verl._config import ConfigError, TraceConfig
from otel_verl._processor import BoundedBatchProcessor, TrajectoryAttributesProcessor

SCOPE_NAME = "otel_verl"


def build_resource(config: TraceConfig) -> Resource:
    """service, project, experiment, host and pid, merged over ``OTEL_RESOURCE_ATTRIBUTES``."""
    ours = Resource.create({
        semconv.SERVICE_NAME: config.service_name,
        semconv.ROLLOUT_PROJECT_NAME: config.project_name,
        semconv.ROLLOUT_EXPERIMENT_NAME: config.experiment_name,
        semconv.HOST_NAME: socket.gethostname(),
        semconv.PROCESS_PID: os.getpid(),
    })
    return ours


def build_exporter(config: TraceConfig) -> SpanExporter:
    """The backend's exporter, wrapped in the spooling exporter where delivery can fail.

    Raises:
        ConfigError: the backend needs a package that is not installed.
    """
    backend = config.backend
    if backend == "file":
        from otel_verl._file_exporter import FileSpanExporter

        return FileSpanExporter(config.trace_dir)
    if backend == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if backend == "otlp":
        return _spooling(config, _otlp_exporter(config))
    if backend == "weave":
        return _weave_exporter(config)
    raise ConfigError(f"backend: no exporter for {backend!r}")


def _weave_exporter(config: TraceConfig) -> SpanExporter:
    """backend=weave: our exporter's calls (``weave_ingest=calls``), or the same spans through
    Weave's own OTel ingestion (``otel``; spooled by the core like OTLP)."""
    try:
        import otel_weave_exporter
    except ImportError:
        raise ConfigError("backend=weave needs the Weave exporter: "
                          "pip install 'otel-verl[weave]' (package otel-weave-exporter)") from None
    common: dict[str, Any] = {
        "project": config.project_name, "entity": config.weave_entity,
        "base_url": config.weave_base_url, "threads": config.weave_threads,
        "wandb_run_id": config.wandb_run_id,
    }
    if config.weave_ingest == "otel":
        try:
            exporter = otel_weave_exporter.WeaveOtlpSpanExporter(
                timeout_s=config.export_timeout_s, **common)
        except ImportError as exc:
            raise ConfigError(f"weave_ingest=otel: {exc}") from None
        return _spooling(config, exporter)
    # the Weave exporter spools the calls it could not deliver itself (already translated,
    # replayable with `python -m otel_weave_exporter replay`), so no second spool here
    return otel_weave_exporter.WeaveSpanExporter(
        keep_trajectory_spans=config.weave_keep_trajectory,
        include_otel_attributes=config.weave_include_otel_attributes,
        spool_dir=config.spool_dir or os.path.join(config.trace_dir, "spool", "weave"),
        **common)


def _otlp_exporter(config: TraceConfig) -> SpanExporter:
    kwargs: dict[str, Any] = {}
    if config.otlp_protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError("backend=otlp with protocol grpc needs "
                              "opentelemetry-exporter-otlp-proto-grpc: pip install "
                              "'otel-verl[otlp]'") from None
        if config.otlp_endpoint:
            kwargs["endpoint"] = config.otlp_endpoint
            kwargs["insecure"] = not config.otlp_endpoint.startswith("https://")
        return OTLPSpanExporter(timeout=config.export_timeout_s, **kwargs)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    except ImportError:
        raise ConfigError("backend=otlp with protocol http/protobuf needs "
                          "opentelemetry-exporter-otlp-proto-http: pip install "
                          "'otel-verl[otlp]'") from None
    if config.otlp_endpoint:
        endpoint = config.otlp_endpoint.rstrip("/")
        kwargs["endpoint"] = endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
    return Http(timeout=config.export_timeout_s, **kwargs)


def _spooling(config: TraceConfig, exporter: SpanExporter) -> SpanExporter:
    from otel_verl._spool import SpoolingSpanExporter

    spool_dir = config.spool_dir or os.path.join(config.trace_dir, "spool")
    return SpoolingSpanExporter(exporter, spool_dir)


def build_provider(
    config: TraceConfig,
    current_trajectory: Callable[[], tuple[Mapping[str, Any], int | None] | None],
    exporter: SpanExporter | None = None,
) -> tuple[TracerProvider, SpanExporter, SpanProcessor]:
    """A TracerProvider with the trajectory-attributes processor and one export processor.

    Args:
        config: the resolved configuration (``config.enabled`` must be true).
        current_trajectory: returns the current trajectory's (attributes, span id), or None.
        exporter: replaces the backend's exporter (tests, custom sinks).

    Returns:
        The provider, its exporter and its export processor.
    """
    exporter = exporter if exporter is not None else build_exporter(config)
    provider = TracerProvider(resource=build_resource(config))
    provider.add_span_processor(TrajectoryAttributesProcessor(
        current_trajectory, semconv.ROLLOUT_EXPERIMENT_NAME, semconv.OTEL_VERL_TRAJECTORY_CHILD))
    if config.processor == "simple":
        processor: SpanProcessor = SimpleSpanProcessor(exporter)
    else:
        processor = BoundedBatchProcessor(exporter, max_queue_size=config.max_queue_size,
                                          max_export_batch_size=config.max_export_batch_size,
                                          schedule_delay_s=config.schedule_delay_s)
    provider.add_span_processor(processor)
    return provider, exporter, processor
