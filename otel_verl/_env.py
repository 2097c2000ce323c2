"""Environment variable names otel_verl reads, as documented constants.

Standard ``OTEL_*`` names are reused where one exists; ``OTEL_VERL_*`` names exist only for what
is ours. Each is read in one place (``_config``).
"""

from __future__ import annotations

from typing import Final

# ours
OTEL_VERL_BACKEND: Final = "OTEL_VERL_BACKEND"
OTEL_VERL_PROJECT_NAME: Final = "OTEL_VERL_PROJECT_NAME"
OTEL_VERL_EXPERIMENT_NAME: Final = "OTEL_VERL_EXPERIMENT_NAME"
OTEL_VERL_TRACE_DIR: Final = "OTEL_VERL_TRACE_DIR"
OTEL_VERL_TOKEN2TEXT: Final = "OTEL_VERL_TOKEN2TEXT"
OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER: Final = "OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER"
OTEL_VERL_MAX_FIELD_BYTES: Final = "OTEL_VERL_MAX_FIELD_BYTES"
OTEL_VERL_MAX_SPAN_BYTES: Final = "OTEL_VERL_MAX_SPAN_BYTES"
OTEL_VERL_REDACT: Final = "OTEL_VERL_REDACT"
OTEL_VERL_CAPTURE_PAYLOADS: Final = "OTEL_VERL_CAPTURE_PAYLOADS"
OTEL_VERL_PROCESSOR: Final = "OTEL_VERL_PROCESSOR"
OTEL_VERL_SPOOL_DIR: Final = "OTEL_VERL_SPOOL_DIR"
OTEL_VERL_WEAVE_ENTITY: Final = "OTEL_VERL_WEAVE_ENTITY"
OTEL_VERL_WEAVE_BASE_URL: Final = "OTEL_VERL_WEAVE_BASE_URL"
OTEL_VERL_REDACT_PATTERNS: Final = "OTEL_VERL_REDACT_PATTERNS"
OTEL_VERL_DURABLE: Final = "OTEL_VERL_DURABLE"
OTEL_VERL_MAX_QUEUE_BYTES: Final = "OTEL_VERL_MAX_QUEUE_BYTES"
OTEL_VERL_MAX_REQUEST_BYTES: Final = "OTEL_VERL_MAX_REQUEST_BYTES"
OTEL_VERL_MAX_SPOOL_BYTES: Final = "OTEL_VERL_MAX_SPOOL_BYTES"
OTEL_VERL_EXPORT_DELAY: Final = "OTEL_VERL_EXPORT_DELAY"
# tail sampling (``otel_verl.exporters._tail``)
OTEL_VERL_TAIL_KEEP: Final = "OTEL_VERL_TAIL_KEEP"
OTEL_VERL_GROUP_SIZE: Final = "OTEL_VERL_GROUP_SIZE"
OTEL_VERL_TAIL_REWARD_Z: Final = "OTEL_VERL_TAIL_REWARD_Z"
OTEL_VERL_TAIL_MAX_PER_STEP_PER_WORKER: Final = "OTEL_VERL_TAIL_MAX_PER_STEP_PER_WORKER"
OTEL_VERL_TAIL_BUFFER_BYTES: Final = "OTEL_VERL_TAIL_BUFFER_BYTES"
OTEL_VERL_TAIL_GROUP_TIMEOUT_S: Final = "OTEL_VERL_TAIL_GROUP_TIMEOUT_S"
#: detectors tagging ``rl.flag.<name>`` (``otel_verl.exporters._detect``)
OTEL_VERL_DETECT_FLAGS: Final = "OTEL_VERL_DETECT_FLAGS"
#: in-flight records (``otel_verl._live``): on/off, and the stuck threshold
OTEL_VERL_LIVE: Final = "OTEL_VERL_LIVE"
OTEL_VERL_STUCK_AFTER_S: Final = "OTEL_VERL_STUCK_AFTER_S"
#: the exporter's compaction of the local store (``otel_verl.exporters._compactor``)
OTEL_VERL_COMPACT: Final = "OTEL_VERL_COMPACT"
OTEL_VERL_COMPACT_INTERVAL_S: Final = "OTEL_VERL_COMPACT_INTERVAL_S"
OTEL_VERL_COMPACT_LIVE_BYTES: Final = "OTEL_VERL_COMPACT_LIVE_BYTES"
#: ``calls`` (the Weave exporter) or ``otel`` (Weave's own OTel ingestion, /otel/v1/traces)
OTEL_VERL_WEAVE_INGEST: Final = "OTEL_VERL_WEAVE_INGEST"
#: the whole resolved configuration as JSON, set by ``RolloutTraceConfig.export_env()`` for
#: worker processes (Ray runtime_env) and read by ``RolloutTraceConfig.init_from_env()``
OTEL_VERL_CONFIG: Final = "OTEL_VERL_CONFIG"

# standard OpenTelemetry names
#: the SDK's exporter selector (a comma list); honoured below ``OTEL_VERL_BACKEND``
OTEL_TRACES_EXPORTER: Final = "OTEL_TRACES_EXPORTER"
OTEL_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
OTEL_EXPORTER_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_BSP_MAX_QUEUE_SIZE: Final = "OTEL_BSP_MAX_QUEUE_SIZE"
OTEL_BSP_SCHEDULE_DELAY: Final = "OTEL_BSP_SCHEDULE_DELAY"
OTEL_BSP_MAX_EXPORT_BATCH_SIZE: Final = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
#: ``otlp``: rewards also as log-based events to the OTLP collector (``otel_verl._evaluations``)
OTEL_LOGS_EXPORTER: Final = "OTEL_LOGS_EXPORTER"

# the Weave exporter's own names (otel-weave-exporter reads them too, standalone)
OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY: Final = "OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY"
OTEL_EXPORTER_WEAVE_THREADS: Final = "OTEL_EXPORTER_WEAVE_THREADS"
# wandb's own: the run id (``wandb.init`` honours a preset one)
WANDB_RUN_ID: Final = "WANDB_RUN_ID"
