"""The durable log's former module, kept so that code importing from it keeps working.

The durable log now lives in ``_durable`` (:class:`DurableSpanExporter`, the glue), ``_log``
(the storage), ``_stream`` (one writer's files), ``_records`` (the record format),
``_sender`` (the sender) and ``_replay`` (replay by hand). Import the public names from
:mod:`otel_verl.exporters` rather than from here.
"""

from __future__ import annotations

import warnings
from typing import Any

from otel_verl.exporters._durable import DurableSpanExporter
from otel_verl.exporters._log import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_SPOOL_BYTES,
    backend_identity,
    log_dir_name,
)
from otel_verl.exporters._records import TRUNCATED_ATTRIBUTE, fit_span, seal, unseal
from otel_verl.exporters._replay import replay
from otel_verl.exporters._spans import call_export, suppressed_instrumentation, timeout_seconds
from otel_verl.exporters._stream import LogReadError, adopt_streams, keep_damaged

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_SPOOL_BYTES",
    "TRUNCATED_ATTRIBUTE",
    "DurableSpanExporter",
    "LogReadError",
    "adopt_streams",
    "backend_identity",
    "call_export",
    "fit_span",
    "keep_damaged",
    "log_dir_name",
    "replay",
    "seal",
    "suppressed_instrumentation",
    "timeout_seconds",
    "unseal",
]


def __getattr__(name: str) -> Any:
    """``SpoolingSpanExporter``: the exporter's former name (deprecated; it warns)."""
    if name == "SpoolingSpanExporter":
        warnings.warn("SpoolingSpanExporter is deprecated; use "
                      "otel_verl.exporters.DurableSpanExporter", DeprecationWarning, stacklevel=2)
        return DurableSpanExporter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
