"""Span exporters and the export processor, usable with any OpenTelemetry ``TracerProvider``.

Usage::

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from otel_verl.exporters import BoundedBatchProcessor, DurableSpanExporter, FileSpanExporter

    provider = TracerProvider()
    # the local store (OTLP/JSON lines, read with `otel-verl traces`)
    provider.add_span_processor(BoundedBatchProcessor(FileSpanExporter("./traces")))
    # any backend, through a log on disk: nothing lost to an outage, a crash or a restart
    provider.add_span_processor(BoundedBatchProcessor(
        DurableSpanExporter(OTLPSpanExporter(), "./traces/spool/otlp")))

    replay("./traces/spool/otlp", OTLPSpanExporter())  # what is left, by hand

    install_sigterm_handoff()  # SIGTERM hands the queues to the exporters first (init does this)

What is here:

- :class:`FileSpanExporter`: the local store's writer (one OTLP/JSON line per batch, one file
  per process; the OpenTelemetry Collector ``file`` exporter's format).
- :class:`DurableSpanExporter`: wraps any exporter with a write-ahead log and a delivery cursor
  (see :mod:`otel_verl.exporters._durable` for the guarantees); :func:`replay` sends a log (or any store
  file) by hand, split into requests under a byte cap.
- :class:`BoundedBatchProcessor`: a batch span processor bounded in spans and bytes, bounded in
  time at flush and shutdown, with a span ``transform`` hook (redaction) on its export thread.

Statistics (``stats()``; ``RolloutTraceConfig.stats()`` merges the processor's and the
exporter's, and the Weave exporter uses the same names where they mean the same thing). Counters
since start unless marked *gauge*:

========================== ==================================================================
key                        meaning
========================== ==================================================================
``queued``                 spans the processor accepted into its in-memory queue
``exported``               spans the processor handed to its exporter with success (with the
                           durable log: written to disk)
``export_failed``          spans the exporter reported as failed (**lost**)
``dropped_queue_full``     spans dropped because the queue was full in spans or bytes (**lost**)
``dropped_after_shutdown`` spans that ended after shutdown (**lost**)
``dropped_transform_failed`` spans the transform (redaction) raised on (**lost**, never sent)
``abandoned_at_shutdown``  spans still queued when shutdown's time ran out, with an exporter
                           that is not the durable log (**lost**)
``kept_in_log_at_shutdown`` spans still queued when shutdown's time ran out, handed to the
                           durable log unredacted (redacted when read back, never sent as is)
``pending``                *gauge*: spans in the processor's queue or export call
``queue_bytes``            *gauge*: estimated bytes in the processor's queue
``spooled``                spans written to the durable log
``spool_failed``           spans neither written to the log nor delivered directly (**lost**)
``delivered``              spans the backend accepted
``recovered``              of those, spans left by an earlier process
``requests``               export requests the backend accepted
``request_bytes``          their size (OTLP/JSON bytes of their spans)
``retries``                failed delivery attempts (the spans stay in the log)
``truncated``              spans cut to fit ``max_request_bytes`` (marked
                           ``otel_verl.request_truncated``)
``quarantined``            spans the backend kept refusing while it accepted others (moved to
                           ``quarantine/`` in the log's directory, not retried)
``dropped_spool_full``     spans dropped from the log to keep it under ``max_spool_bytes``
                           (**lost**)
``spooled_unredacted``     of ``spooled``, records written before redaction (at shutdown)
``log_damaged``            records whose checksum or JSON failed on reading (kept in
                           ``damaged/`` beside the log, never sent altered)
``log_read_errors``        segments that could not be read (EIO, EMFILE, ...): kept, retried
``log_cursor_resets``      damaged cursors that fell back to the start of their segment (spans
                           may be sent twice, never skipped)
``file_written``           spans the file exporter wrote to the local store
``file_write_failed``      spans it could not write (also in ``export_failed``)
``file_warnings``          write-failure warnings it logged (rate-limited)
``file_warnings_suppressed`` write-failure warnings held back by the rate limit
``compact_started``        compaction children the file exporter started (``compact``; each
                           compacts the store into the lake at idle priority, ``_compactor``)
``compact_done``           children that finished (or found nothing to do)
``compact_busy``           children that found another compaction holding the lake's lock
``compact_failed``         children that could not start or exited with an error (logged)
``compact_killed``         children killed: running past an hour, or at shutdown
``spool_pending``          *gauge*: spans in this process's log not yet delivered
``spool_bytes``            *gauge*: bytes of this process's log on disk
``spool_held_bytes``       *gauge*: bytes held in memory because the log cannot be written
                           (a full disk) while the backend does not answer
``backend.<key>``          the wrapped exporter's own ``stats()`` (e.g. the Weave exporter's),
                           reported by the durable log; not counted as losses here (the log
                           keeps and retries what the backend refused)
========================== ==================================================================
"""

from __future__ import annotations

from otel_verl.exporters._delivery import LOSS_KEYS
from otel_verl.exporters._durable import DurableSpanExporter
from otel_verl.exporters._file_exporter import FileSpanExporter
from otel_verl.exporters._processor import BoundedBatchProcessor
from otel_verl.exporters._records import TRUNCATED_ATTRIBUTE
from otel_verl.exporters._replay import replay


def install_sigterm_handoff() -> None:
    """On SIGTERM (Python's default: die without running atexit), hand every live
    :class:`BoundedBatchProcessor`'s queue to its exporter (with the durable log: a disk write)
    before dying as SIGTERM would. ``RolloutTraceConfig.init`` does this itself; call it when you
    wire a provider by hand. Installed once per process, from the main thread, and only while
    SIGTERM has its default action (an application's own handler is kept)."""
    from otel_verl._state import STATE

    STATE._install_sigterm_hook()


__all__ = [
    "LOSS_KEYS",
    "TRUNCATED_ATTRIBUTE",
    "BoundedBatchProcessor",
    "DurableSpanExporter",
    "FileSpanExporter",
    "install_sigterm_handoff",
    "replay",
]
