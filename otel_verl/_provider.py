"""Build otel_verl's own TracerProvider from a TraceConfig.

The provider is never installed as the global one: an application's (or ``weave.init``'s) global
provider is left alone, and otel_verl's spans still join the current trace through the shared
context.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

from otel_verl import semconv
from otel_verl._config import ConfigError, TraceConfig
from otel_verl._fork import register_after_in_child
from otel_verl.exporters._processor import BoundedBatchProcessor, TrajectoryAttributesProcessor
from otel_verl.exporters._scrub import ScrubbingSpanExporter, build_scrubber

SCOPE_NAME = "otel_verl"


class _IdGenerator(IdGenerator):
    """Random ids from a private generator seeded by the OS (and reseeded after fork).

    The SDK's default draws from the ``random`` module, so workers that all call
    ``random.seed(42)`` (as RL code does for reproducibility) produce the same span ids.
    """

    _rng = random.Random(os.urandom(32))

    def generate_span_id(self) -> int:
        span_id = self._rng.getrandbits(64)
        while span_id == 0:
            span_id = self._rng.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._rng.getrandbits(128)
        while trace_id == 0:
            trace_id = self._rng.getrandbits(128)
        return trace_id


def _reseed_ids() -> None:
    _IdGenerator._rng.seed(os.urandom(32))


register_after_in_child(_reseed_ids, "the span id generator")


def build_resource(config: TraceConfig) -> Resource:
    """service, project, experiment, host and pid, merged over ``OTEL_RESOURCE_ATTRIBUTES``.

    The project is also ``openinference.project.name``: Phoenix files the spans under it.
    """
    ours = Resource.create({
        semconv.SERVICE_NAME: config.service_name,
        semconv.ROLLOUT_PROJECT_NAME: config.project_name,
        semconv.OPENINFERENCE_PROJECT_NAME: config.project_name,
        semconv.ROLLOUT_EXPERIMENT_NAME: config.experiment_name,
        semconv.HOST_NAME: socket.gethostname(),
        semconv.PROCESS_PID: os.getpid(),
    })
    return ours


def build_exporter(config: TraceConfig) -> SpanExporter:
    """The backend's exporter; otlp and weave deliver through the durable log (``durable``).

    Raises:
        ConfigError: the backend needs a package that is not installed.
    """
    backend = config.backend
    if backend == "file":
        from otel_verl.exporters._file_exporter import FileSpanExporter

        compactor = None
        if config.compact and config.processor == "batch":  # started on the export thread only
            from otel_verl.exporters import _compactor

            compactor = _compactor.from_config(config)
        return FileSpanExporter(config.trace_dir, compactor=compactor)
    if backend == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if backend == "otlp":
        return durable(config, _otlp_exporter(config))
    if backend == "weave":
        return durable(config, _weave_exporter(config))
    raise ConfigError(f"backend: no exporter for {backend!r}")


def _weave_exporter(config: TraceConfig) -> SpanExporter:
    """backend=weave: our exporter's calls (``weave_ingest=calls``), or the same spans through
    Weave's own OTel ingestion (``otel``). Either way the core's durable log sits in front
    (``durable``)."""
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
        return exporter
    # with the durable log, the log keeps what Weave does not accept (and retries it): the
    # exporter's own spool would hold calls nothing retries automatically
    spool_dir = None if _durable(config) else (config.spool_dir or os.path.join(
        config.trace_dir, "spool", "weave"))
    return otel_weave_exporter.WeaveSpanExporter(
        keep_trajectory_spans=config.weave_keep_trajectory,
        include_otel_attributes=config.weave_include_otel_attributes,
        spool_dir=spool_dir, timeout_s=config.export_timeout_s, **common,
        **_weave_content_options(config))


def _weave_content_options(config: TraceConfig) -> dict[str, Any]:
    """The per-turn content store the Weave exporter reads deltas beyond a span's cap from
    (``docs/weave.md``), and the flush that writes this process's buffered nodes out first;
    none for an older exporter that has no such options."""
    import dataclasses

    from otel_weave_exporter import ExporterConfig

    if "content_dir" not in {f.name for f in dataclasses.fields(ExporterConfig)}:
        return {}
    from otel_verl import _content

    return {"content_dir": os.path.join(config.trace_dir, _content.CONTENT_DIR),
            "content_flush": lambda: _content.flush_all(timeout_s=2.0)}


def _durable(config: TraceConfig) -> bool:
    return config.durable and config.processor == "batch"


def spool_dir_for(config: TraceConfig, exporter: SpanExporter | None = None) -> str:
    """The durable log's directory: ``spool_dir``, else ``<trace_dir>/spool/<backend key>``.

    One directory per backend (and endpoint/project), so the next process with the same trace
    dir and backend finds and delivers what an earlier one left.
    """
    if config.spool_dir:
        return os.path.abspath(config.spool_dir)
    from otel_verl.exporters._spool import log_dir_name

    # a readable prefix (no credentials) beside a hash of the whole key: never shared
    return os.path.abspath(os.path.join(config.trace_dir, "spool",
                                        log_dir_name(*_backend_key(config, exporter))))


def _backend_key(config: TraceConfig, exporter: SpanExporter | None) -> tuple[str, str]:
    """(kind, endpoint) naming the backend a durable log delivers to."""
    if config.backend == "otlp":
        return f"otlp-{config.otlp_protocol}", config.otlp_endpoint or "default"
    if config.backend == "weave":
        return f"weave-{config.weave_entity or ''}-{config.project_name}", ""
    return (f"exporter-{type(exporter).__name__}" if exporter is not None else "exporter"), ""


def durable(config: TraceConfig, exporter: SpanExporter) -> SpanExporter:
    """``exporter`` behind the durable log when ``config`` asks for it (batch processor only)."""
    if not _durable(config):
        return exporter
    from otel_verl.exporters._spool import DurableSpanExporter, backend_identity

    return DurableSpanExporter(
        exporter, spool_dir_for(config, exporter), max_spool_bytes=config.max_spool_bytes,
        backend_id=backend_identity(*_backend_key(config, exporter)),
        max_request_bytes=config.max_request_bytes,
        max_batch_spans=config.max_export_batch_size, export_delay_s=config.export_delay_s,
        shutdown_timeout_s=config.export_timeout_s,
        max_overflow_bytes=config.max_queue_bytes // 4,
        # what the processor hands over unredacted at shutdown, and what a later process adopts,
        # is redacted with this process's own rules (redact_patterns included) before sending
        transform=build_scrubber(config))


def _otlp_exporter(config: TraceConfig) -> SpanExporter:
    """The OTLP exporter for ``otlp_endpoint`` (else the ``OTEL_EXPORTER_OTLP_*`` variables).

    Credentials in the endpoint never reach a log line: the libraries' loggers get a filter
    that redacts them (``_otlp_endpoint.install_log_filter``). Over HTTP the signal path goes
    into the URL's path, before a query string; gRPC, which has no userinfo, gets
    ``user:password@`` as a Basic ``authorization`` header.
    """
    from otel_verl.exporters import _otlp_endpoint

    _otlp_endpoint.install_log_filter([config.otlp_endpoint])
    kwargs: dict[str, Any] = {}
    if config.otlp_protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError("backend=otlp with protocol grpc needs "
                              "opentelemetry-exporter-otlp-proto-grpc: pip install "
                              "'otel-verl[otlp]'") from None
        if config.otlp_endpoint:
            endpoint, user, password = _otlp_endpoint.split_userinfo(config.otlp_endpoint)
            kwargs["endpoint"] = endpoint
            kwargs["insecure"] = not endpoint.startswith("https://")
            if user is not None:
                kwargs["headers"] = {**_otlp_env_headers(), "authorization":
                                     _otlp_endpoint.basic_auth_header(user, password)}
        return OTLPSpanExporter(timeout=config.export_timeout_s, **kwargs)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    except ImportError:
        raise ConfigError("backend=otlp with protocol http/protobuf needs "
                          "opentelemetry-exporter-otlp-proto-http: pip install "
                          "'otel-verl[otlp]'") from None
    if config.otlp_endpoint:
        kwargs["endpoint"] = _otlp_endpoint.join_signal_path(config.otlp_endpoint)
    return Http(timeout=config.export_timeout_s, **kwargs)


def _otlp_env_headers() -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else ``OTEL_EXPORTER_OTLP_HEADERS``), as the gRPC
    exporter reads them when it is given no headers."""
    from opentelemetry.util.re import parse_env_headers

    raw = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
           or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS") or "")
    return dict(parse_env_headers(raw, liberal=True))


def build_provider(
    config: TraceConfig,
    current_trajectory: Callable[[], tuple[Any, ...] | None],
    exporter: SpanExporter | None = None,
    transform: Callable[[ReadableSpan], ReadableSpan] | None = None,
) -> tuple[TracerProvider, SpanExporter, SpanProcessor]:
    """A TracerProvider with the trajectory-attributes processor and one export processor.

    Args:
        config: the resolved configuration (``config.enabled`` must be true).
        current_trajectory: returns the current trajectory's (attributes, span id[, its direct
            children's attributes]), or None (``TrajectoryAttributesProcessor``).
        exporter: replaces the backend's exporter (custom sinks; behind the durable log with
            the batch processor unless ``durable=False``).
        transform: applied to every span on the export thread before anything is written or
            sent (redaction); batch processor only.

    Returns:
        The provider, its exporter and its export processor.
    """
    exporter = durable(config, exporter) if exporter is not None else build_exporter(config)
    # redaction: one pass per finished span, on the export thread with the batch processor,
    # before anything is written to the durable log or sent; the exporter itself is returned
    # unwrapped (stats, get_client)
    scrubber = transform if transform is not None else build_scrubber(config)
    provider = TracerProvider(resource=build_resource(config), id_generator=_IdGenerator())
    provider.add_span_processor(TrajectoryAttributesProcessor(
        current_trajectory, semconv.ROLLOUT_EXPERIMENT_NAME, semconv.OTEL_VERL_TRAJECTORY_CHILD))
    if config.processor == "simple":
        sink = exporter if scrubber is None else ScrubbingSpanExporter(exporter, scrubber)
        processor: SpanProcessor = SimpleSpanProcessor(sink)
    else:
        processor = BoundedBatchProcessor(exporter, max_queue_size=config.max_queue_size,
                                          max_queue_bytes=config.max_queue_bytes,
                                          max_export_batch_size=config.max_export_batch_size,
                                          max_batch_bytes=config.max_request_bytes,
                                          schedule_delay_s=config.schedule_delay_s,
                                          transform=scrubber)
    if config.tail_keep:  # tail sampling sits before the export processor (otel_verl.exporters._tail)
        from otel_verl.exporters._tail import TailSamplingProcessor

        processor = TailSamplingProcessor.from_config(processor, config, provider.resource)
    detectors = config.detect_flags or (("all",) if "flags" in config.tail_keep else ())
    if detectors:  # detectors before tail sampling, on their own thread (exporters/_detect.py)
        from otel_verl.exporters._detect import FlaggingProcessor, known_detectors

        names = known_detectors() if detectors == ("all",) else detectors
        processor = FlaggingProcessor(processor, names,
                                      step_timeout_s=config.tail_group_timeout_s)
    provider.add_span_processor(processor)
    if config.backend == "otlp":  # rewards also as log-based events (otel_verl._evaluations)
        from otel_verl import _evaluations

        logs = _evaluations.otlp_logs(config)
        if logs is not None:
            provider.add_span_processor(logs)
    return provider, exporter, processor
