"""A durable log's records: one span per record, cut to fit a request, sealed with a checksum.

A record is the span's OTLP/JSON line (the local store's format, so ``otel-verl traces`` reads a
log) with a trailer inside its top-level object; see the format notes below. Decoding goes
through the codec (``otel_verl._otlp_json``).
"""

from __future__ import annotations

import re
import zlib

from opentelemetry.sdk.trace import ReadableSpan

from otel_verl import _otlp_json, semconv
from otel_verl.exporters._spans import copy_span

#: the attribute set on a span that was cut to fit ``max_request_bytes`` (True); capture's own
#: cut (``otel_verl.truncated``, the list of cut fields) is a different key and is kept
TRUNCATED_ATTRIBUTE = semconv.OTEL_VERL_REQUEST_TRUNCATED


# --- cutting a span to fit ------------------------------------------------------------------------


def fit_span(span: ReadableSpan, max_bytes: int) -> tuple[ReadableSpan, bytes, bool]:
    """``span`` and its log line, cut (longest strings first, then events) to ``max_bytes``;
    a cut span is marked ``TRUNCATED_ATTRIBUTE = True``.

    Returns:
        (the span, its OTLP/JSON line, whether it was cut).
    """
    line = _otlp_json.encode_span_line(span)
    if len(line) <= max_bytes:
        return span, line, False
    attributes = dict(span.attributes or {})
    events = list(span.events)
    for _ in range(64):
        excess = len(line) - max_bytes
        if excess <= 0:
            break
        longest = max(((k, v) for k, v in attributes.items() if isinstance(v, str)),
                      key=lambda kv: len(kv[1]), default=None)
        if longest is not None and len(longest[1]) > 64:
            key, value = longest
            keep = max(0, len(value) - excess - 64)
            attributes[key] = value[:keep] + "…[truncated]"
        elif events:
            events = events[: len(events) // 2]
        elif attributes:
            attributes.pop(next(iter(attributes)))
        else:
            break
        attributes[TRUNCATED_ATTRIBUTE] = True
        span = copy_span(span, attributes=attributes, events=events)
        line = _otlp_json.encode_span_line(span)
    return span, line, True


# --- the record format ------------------------------------------------------------------------------
#
# Format 1 (before checksums): a record is one OTLP/JSON line, ``{"resourceSpans":[...]}\n``.
# Format 2: the same line with a trailer inside its top-level object (so it stays a valid store
# line that `otel-verl traces` and JSON readers read), ``...,"otelVerlLog":"2 <crc32> <flag>"}\n``:
# the CRC-32 of the bytes before the trailer plus the flag; the flag is ``r`` (ready to send) or
# ``u`` (not yet redacted: the reader applies the transform before sending). A stream records
# its format and its backend in ``<stream>.meta``; in a format-2 stream a line without a valid
# trailer is damage. Format-1 lines are still read (JSON validity is their only check).

_TRAILER_HEAD = b',"otelVerlLog":"'
_TRAILER_LEN = len(_TRAILER_HEAD) + len(b'2 00000000 r"}\n')
_TRAILER = re.compile(rb'2 (?P<crc>[0-9a-f]{8}) (?P<flag>[ru])"\}\n')
RECORD_FORMAT = 2


def seal(line: bytes, raw: bool = False) -> bytes:
    """A format-2 record from one OTLP/JSON line (``{...}\\n``): checksummed, flagged."""
    body = line[:-2] if line.endswith(b"}\n") else line.rstrip(b"\n")[:-1]
    flag = b"u" if raw else b"r"
    return b"%s%s2 %08x %s\"}\n" % (body, _TRAILER_HEAD, zlib.crc32(body + flag), flag)


def unseal(record: bytes, sealed_stream: bool) -> tuple[bytes | None, bool]:
    """(the OTLP/JSON line, whether it still needs redaction), or (None, False) when damaged.

    A record without a trailer is a format-1 line: returned as it is, unless the stream is
    format 2 (then it is damage). A trailer whose checksum does not match is damage."""
    if len(record) > _TRAILER_LEN and record[-_TRAILER_LEN:-_TRAILER_LEN + len(_TRAILER_HEAD)] \
            == _TRAILER_HEAD:
        match = _TRAILER.fullmatch(record, len(record) - _TRAILER_LEN + len(_TRAILER_HEAD))
        body = record[:-_TRAILER_LEN]
        if match is None or zlib.crc32(body + match["flag"]) != int(match["crc"], 16):
            return None, False
        return body + b"}\n", match["flag"] == b"u"
    if sealed_stream or not record.endswith(b"\n"):
        return None, False
    return record, False


def decode_line(line: bytes) -> list[ReadableSpan] | None:
    """The spans of one OTLP/JSON line (through the codec), or None when it is not one."""
    try:
        return [_otlp_json.readable_span(span)
                for span in _otlp_json.iter_spans(_otlp_json.decode_line(line))]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
