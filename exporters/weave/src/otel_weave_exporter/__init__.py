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
``OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY``, ``OTEL_EXPORTER_WEAVE_THREADS``, ``WANDB_RUN_ID``.
``WeaveOtlpSpanExporter`` sends the same spans to Weave's own OTel ingestion instead
(``pip install 'otel-weave-exporter[otlp]'``). Registered as the ``weave`` entry point of
``opentelemetry_traces_exporter`` (``OTEL_TRACES_EXPORTER=weave``).
"""

from typing import TYPE_CHECKING, Any

from otel_weave_exporter._exporter import STATS_KEYS, ExporterConfig, WeaveSpanExporter
from otel_weave_exporter._replay import replay

if TYPE_CHECKING:
    from otel_weave_exporter._otlp import WeaveOtlpSpanExporter

__all__ = ["STATS_KEYS", "ExporterConfig", "WeaveOtlpSpanExporter", "WeaveSpanExporter", "replay"]


def __getattr__(name: str) -> Any:
    # the OTLP path imports the OTLP/HTTP exporter (an optional dependency) only when asked for
    if name == "WeaveOtlpSpanExporter":
        from otel_weave_exporter._otlp import WeaveOtlpSpanExporter

        return WeaveOtlpSpanExporter
    raise AttributeError(name)


__version__ = "0.1.0"
