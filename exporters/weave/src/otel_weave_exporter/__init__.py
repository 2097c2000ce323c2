"""OpenTelemetry span exporter for W&B Weave: each finished span becomes one complete Weave call.

Usage::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from otel_weave_exporter import WeaveSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(WeaveSpanExporter(project="entity/project")))

Configuration (argument > environment > default): ``WANDB_API_KEY`` (required),
``OTEL_EXPORTER_WEAVE_PROJECT`` / ``WANDB_PROJECT``, ``WANDB_ENTITY``,
``OTEL_EXPORTER_WEAVE_ENDPOINT`` (else weave's ``WF_TRACE_SERVER_URL`` / ``WANDB_BASE_URL`` rule),
``OTEL_EXPORTER_WEAVE_TIMEOUT``, ``OTEL_EXPORTER_WEAVE_SPOOL_DIR``,
``OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY``. Registered as the ``weave`` entry point of
``opentelemetry_traces_exporter`` (``OTEL_TRACES_EXPORTER=weave``).
"""

from otel_weave_exporter._exporter import ExporterConfig, WeaveSpanExporter
from otel_weave_exporter._replay import replay

__all__ = ["ExporterConfig", "WeaveSpanExporter", "replay"]
__version__ = "0.1.0"
