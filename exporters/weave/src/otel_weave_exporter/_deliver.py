"""Send encoded calls in request-sized batches, isolating what the server refuses.

Shared by the exporter and the spool replay, so both drain the same way: a batch refused as too
large (413) or as invalid (400/422, e.g. one payload declared JSON that is not) is halved and the
halves retried, down to the one call that is refused; that call is handed back as *rejected*
(the caller quarantines it, never retries it). A call answered 409 (its id exists: a running call
started earlier, or a call delivered before and sent again) is sent as the end of that call
(``_running``). Any other failure (server down, 5xx past the
deadline, 401) stops the delivery: that batch and everything after it come back as *failed*
(worth retrying later).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from otel_weave_exporter._encode import batch_body, split_batches
from otel_weave_exporter._running import eager_path, end_of_encoded
from otel_weave_exporter._transport import HttpSender


@dataclass(frozen=True)
class SpanDelivery:
    """What became of each span of one ``export_detailed`` call (indices into its spans).

    The shape otel_verl's durable log reads (``otel_verl.exporters._delivery``): ``rejected``
    spans were refused for good by the server (their call on its own, as invalid): never retry
    them; ``retryable`` ones were not delivered for a reason that may pass (server down, 5xx,
    deadline). Spans dropped by design (``keep_trajectory_spans=False``) count as accepted.
    """

    accepted: tuple[int, ...] = ()
    #: (span index, the server's answer, or why the span could not become a call)
    rejected: tuple[tuple[int, str], ...] = ()
    retryable: tuple[int, ...] = ()


@dataclass
class Delivery:
    sent: int = 0
    requests: int = 0  # accepted
    retries: int = 0  # failed attempts
    #: (call, the server's answer) for each call refused on its own
    rejected: list[tuple[bytes, str]] = field(default_factory=list)
    #: calls not attempted or failed for a reason that may pass (retry later)
    failed: list[bytes] = field(default_factory=list)
    error: str = ""
    #: complete calls whose id the server had (409): sent as the end of that call instead
    ended_existing: int = 0


#: the answer for a call id that exists (``_running``)
CONFLICT = 409


def deliver(
    sender: HttpSender, path: str, parts: list[bytes], max_request_bytes: int, deadline: float
) -> Delivery:
    """POST ``parts`` to ``path`` before ``deadline`` (monotonic); never raises on HTTP errors."""
    out = Delivery()
    queue = list(split_batches(parts, max_request_bytes))
    while queue:
        batch = queue.pop(0)
        if time.monotonic() >= deadline:
            out.failed = batch + [p for b in queue for p in b]
            out.error = out.error or "deadline passed"
            break
        result = sender.send(path, batch_body(batch), deadline)
        out.retries += result.attempts - (1 if result.ok else 0)
        if result.ok:
            out.requests += 1
            out.sent += len(batch)
            continue
        conflict = result.status == CONFLICT
        if result.too_large or result.rejected or conflict:
            if len(batch) > 1:
                half = len(batch) // 2
                queue[:0] = [batch[:half], batch[half:]]
            elif conflict:  # the call's id exists (started earlier, or delivered before): end it
                ended = sender.send(eager_path(path, "end"), end_of_encoded(batch[0]), deadline)
                out.retries += ended.attempts - (1 if ended.ok else 0)
                if ended.ok:
                    out.requests += 1
                    out.sent += 1
                    out.ended_existing += 1
                elif ended.rejected or ended.too_large:
                    out.rejected.append((batch[0], ended.error))
                else:
                    out.failed = batch + [p for b in queue for p in b]
                    out.error = ended.error
                    break
            else:
                out.rejected.append((batch[0], result.error))
            continue
        out.failed = batch + [p for b in queue for p in b]
        out.error = result.error
        break
    return out
