"""Replay by hand: send what a durable log (or any local-store file) holds through an exporter.

``otel-verl traces replay`` calls :func:`replay`. Files are read through the codec
(``otel_verl._otlp_json``), not through the read side (``otel_verl.store``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from otel_verl import _errors, _otlp_json
from otel_verl.exporters._log import DEFAULT_MAX_REQUEST_BYTES, REQUEST_OVERHEAD
from otel_verl.exporters._records import decode_line, fit_span, unseal
from otel_verl.exporters._spans import call_export
from otel_verl.exporters._stream import SEGMENT, LogReadError, Stream, adopt_streams, keep_damaged

_logger = logging.getLogger("otel_verl")

Transform = Callable[[ReadableSpan], ReadableSpan]


def replay(spool_dir: str | os.PathLike[str], exporter: SpanExporter, *, batch_size: int = 512,
           max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, remove: bool = False,
           progress: Callable[[int], None] | None = None,
           transform: Transform | None = None) -> tuple[int, int]:
    """Send what a log (or any local-store directory/file) holds through ``exporter``.

    Logs of live processes are left alone (their process delivers them). A log is replayed from
    its delivery cursor, in requests of at most ``batch_size`` spans and ``max_request_bytes``,
    and the cursor moves as requests are accepted, so a replay that stops half-way resumes where
    it stopped. Other store files are replayed whole, split the same way.

    Args:
        spool_dir: a log directory, a local-store directory, or one file.
        exporter: where to send (an OTLP exporter, the Weave exporter, ...).
        batch_size: spans per request at most.
        max_request_bytes: request size bound (OTLP/JSON bytes of its spans).
        remove: delete a log (or file) once all of it was accepted.
        progress: called with the number of spans sent after each request.
        transform: applied to records written before redaction (default: the default
            scrubber); they are never sent as they are.

    A damaged record is kept in ``damaged/`` and counted as failed; a log that cannot be read
    is kept (its spans counted as failed) and never removed.

    Returns:
        (spans sent, spans that failed).
    """
    path = Path(spool_dir)
    sent = failed = 0
    limit = max(4096, max_request_bytes) - REQUEST_OVERHEAD
    if path.is_dir():
        redact = [transform]
        for stream in adopt_streams(path):
            stream_sent, stream_failed = _replay_stream(path, stream, exporter, batch_size, limit,
                                                        remove, progress, redact)
            sent += stream_sent
            failed += stream_failed
        files = [p for p in sorted(path.rglob("*.jsonl")) + sorted(path.rglob("*.json"))
                 if not SEGMENT.match(p.name) and "quarantine" not in p.parts
                 and "damaged" not in p.parts]
    else:
        files = [path]
    for file in files:
        file_sent, file_failed = _replay_file(file, exporter, batch_size, limit, progress)
        sent += file_sent
        failed += file_failed
        if remove and file_failed == 0:
            with contextlib.suppress(OSError):
                file.unlink()
    return sent, failed


def _replay_stream(directory: Path, stream: Stream, exporter: SpanExporter, batch_size: int,
                   limit: int, remove: bool, progress: Callable[[int], None] | None,
                   redact: list[Transform | None]) -> tuple[int, int]:
    """One dead writer's log from its cursor; ``redact[0]``: the transform (made on first use)."""
    sent = failed = 0
    if stream.cursor_damage:
        _logger.warning("otel_verl: the delivery cursor of %s is damaged (%s); replaying from the "
                        "start of its segment", stream.name, stream.cursor_damage)
    ok = True
    while ok:
        try:
            lines, after = stream.read(stream.cursor, None, limit, batch_size)
            spans: list[ReadableSpan] = []
            for line in lines:
                body, raw = unseal(line, stream.sealed)
                decoded = decode_line(body) if body is not None else None
                if decoded is None:
                    keep_damaged(directory, stream.name, line)
                    failed += 1
                    _logger.warning("otel_verl: a damaged record in %s is kept in %s",
                                    stream.name, directory / "damaged")
                    continue
                if raw:
                    transform = redact[0]
                    if transform is None:
                        from otel_verl.exporters._scrub import Scrubber

                        transform = redact[0] = Scrubber(())
                    try:
                        decoded = [transform(span) for span in decoded]
                    except Exception as exc:  # noqa: BLE001  # never sent unredacted
                        _errors.internal_error(exc, "replay: a span could not be redacted")
                        failed += len(decoded)
                        continue
                spans.extend(decoded)
        except LogReadError as error:
            _logger.warning("otel_verl: %s; the log is kept", error)
            failed += stream.pending_lines()
            ok = False
            break
        if not lines:
            break
        ok = call_export(exporter, spans) if spans else True
        if ok:
            sent += len(spans)
            stream.save_cursor(after)
            if progress is not None:
                progress(len(spans))
        else:
            failed += stream.pending_lines()
    if ok and remove and stream.fully_read():
        stream.remove()
    else:
        stream.remove_lock_only()
    return sent, failed


def _file_spans(path: Path) -> Iterator[dict[str, Any]]:
    """The span dicts of one store file, through the codec; a line that is not OTLP/JSON (or a
    span that does not decode) is skipped, and one warning at the end says how many."""
    skipped = 0
    first = ""

    def bad(what: str) -> None:
        nonlocal skipped, first
        skipped += 1
        first = first or what

    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, also when the caller stops early
    except FileNotFoundError:
        raise
    except OSError as error:
        _logger.warning("otel_verl: cannot read %s: %r", path, error)
        return
    with handle:
        for lineno, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                resource_spans = _otlp_json.decode_line(raw)
            except ValueError as error:
                bad(f"{path}:{lineno}: {str(error)[:200]}")
                continue
            yield from _otlp_json.iter_spans(resource_spans, bad)
    if skipped:
        _logger.warning("otel_verl: replay skipped %d line(s) or span(s) of %s that are not "
                        "OTLP/JSON (first: %s)", skipped, path, first)


def _replay_file(path: Path, exporter: SpanExporter, batch_size: int, limit: int,
                 progress: Callable[[int], None] | None) -> tuple[int, int]:
    sent = failed = 0
    batch: list[ReadableSpan] = []
    size = 0

    def send() -> None:
        nonlocal sent, failed, batch, size
        if batch:
            if call_export(exporter, batch):
                sent += len(batch)
                if progress is not None:
                    progress(len(batch))
            else:
                failed += len(batch)
        batch, size = [], 0

    for record in _file_spans(path):
        try:
            span, line, _ = fit_span(_otlp_json.readable_span(record), limit)
        except Exception as exc:  # noqa: BLE001
            _errors.internal_error(exc, "replay: a span could not be rebuilt")
            failed += 1
            continue
        if batch and (size + len(line) > limit or len(batch) >= batch_size):
            send()
        batch.append(span)
        size += len(line)
    send()
    return sent, failed
