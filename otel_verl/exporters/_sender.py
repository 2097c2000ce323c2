"""The durable log's sender: one thread that delivers the log (``_log.SpanLog``) to the backend's
exporter, in requests, taking turns between this process's stream and the adopted ones.

- **Backoff**: while the backend fails, capped exponential (``retry_initial_s`` ..
  ``retry_max_s``); the spans wait on disk.
- **Flush waiters**: ``flush`` waits until what was written is delivered (or time runs out).
- **Overflow**: where the log cannot be written (a full disk), spans go to the backend directly
  or, while it does not answer either, wait in memory (``max_overflow_bytes``).
- **Typed outcomes** (``_delivery``): an exporter with ``export_detailed`` (the Weave exporter)
  says which spans its backend refused for good; those are quarantined at once, no probing, and
  what it calls retryable waits (an outage: nothing is halved).
- **Stored bytes** (``_raw_otlp``): for the SDK's OTLP exporters the log's records are sent as
  they are stored (OTLP/JSON to protobuf, no SDK spans between), through the exporter's own
  client or channel; a refusal of the data (400, INVALID_ARGUMENT) is told from an outage.
- **Poison probing** (:class:`PoisonProbe`), the fallback for exporters that cannot say: a
  request that fails is halved until one span fails alone; if the backend accepts others
  meanwhile, that span gets a strike, and after three it is quarantined (the log keeps it in
  ``quarantine/``).

Every request goes through :class:`Backend` (one at a time, instrumentation suppressed).
:class:`Sender` decides when to send and from which stream; :class:`Requests` makes one request
from a stream and settles what it came to.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from otel_verl.exporters import _delivery, _raw_otlp
from otel_verl.exporters._log import Batch, Counts, LogSettings, SpanLog
from otel_verl.exporters._spans import call_export, suppressed_instrumentation
from otel_verl.exporters._stream import Cursor, Stream

_logger = logging.getLogger("otel_verl")

STRIKES_TO_QUARANTINE = 3
ADOPT_EVERY_S = 30.0
# what one attempt to send from a stream came to
_EMPTY, _SENT, _FAILED, _BLOCKED = "empty", "sent", "failed", "blocked"


class PoisonProbe:
    """Tells a span the backend refuses for good from an outage, by strikes.

    A span that fails alone gets a strike when the backend accepted another request since it
    last failed (from any stream: they take turns) or accepts the next span now (where there is
    none, as for the last span of a dead process's log: the last span it accepted, sent again).
    After ``STRIKES_TO_QUARANTINE`` strikes the log quarantines it.
    """

    def __init__(self, log: SpanLog, deliver: Callable[[Sequence[ReadableSpan]], bool]) -> None:
        self._log = log
        self._deliver = deliver
        self._accepted = 0  # requests the backend accepted (the evidence that it is up)
        self._canary: ReadableSpan | None = None  # the last span it accepted: a probe
        self._strikes: dict[tuple[str, Cursor], int] = {}
        self._marks: dict[tuple[str, Cursor], int] = {}

    def accepted(self, spans: Sequence[ReadableSpan]) -> None:
        """The backend accepted a request (``spans``: its last span or more, for the canary)."""
        self._accepted += 1
        if spans:
            self._canary = spans[-1]

    def refused_alone(self, batch: Batch, line: bytes) -> bool:
        """The one record of ``batch`` (``line``) failed alone: True when it is quarantined now
        (the cursor moved past it)."""
        stream = batch.stream
        key = (stream.name, stream.cursor)
        mark = self._marks.get(key)
        evidence = mark is not None and self._accepted > mark
        if not evidence:
            spans = self._log.peek(batch)
            if not spans and self._canary is not None:
                spans = [self._canary]  # no next span: one the backend accepted before (again)
            if spans:
                evidence = self._deliver(spans)
                if evidence:
                    self._accepted += 1
        self._marks[key] = self._accepted
        if not evidence:
            return False  # an outage, not a bad span (as far as anything shows)
        self._strikes[key] = strikes = self._strikes.get(key, 0) + 1
        if strikes < STRIKES_TO_QUARANTINE:
            return False
        del self._strikes[key]
        self._marks.pop(key, None)
        return self._log.quarantine(stream, line, batch.after)


class Overflow:
    """Records that neither the disk nor the backend took, in memory, bounded in bytes; guarded
    by ``lock`` (the sender's condition)."""

    def __init__(self, max_bytes: int, lock: threading.Condition) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._lock = lock
        self._held: collections.deque[tuple[list[bytes], list[ReadableSpan]]] = \
            collections.deque()

    def __bool__(self) -> bool:
        return bool(self._held)

    def records(self) -> int:
        return sum(len(lines) for lines, _ in self._held)

    def offer(self, lines: list[bytes], spans: list[ReadableSpan]) -> bool:
        size = sum(map(len, lines))
        with self._lock:
            if self.bytes + size > self.max_bytes:
                return False
            self._held.append((lines, spans))
            self.bytes += size
        return True

    def send_first(self, log: SpanLog, backend: Backend, counts: Counts) -> tuple[str, int]:
        """The oldest held records into the log if the disk has room, else to the backend:
        (what it came to, how many records were delivered)."""
        lines, spans = self._held[0]
        try:
            log.append(lines)
        except OSError:
            if not backend.send(spans):
                counts.add(retries=1)
                return _FAILED, 0
            counts.add(delivered=len(spans), requests=1, request_bytes=sum(map(len, lines)))
            self._pop()
            return _SENT, len(lines)
        counts.add(spooled=len(lines))
        self._pop()
        return _EMPTY, 0

    def _pop(self) -> None:
        with self._lock:
            lines, _ = self._held.popleft()
            self.bytes -= sum(map(len, lines))


class Backend:
    """The backend's exporter, called one request at a time (the sender's thread, direct sends
    from the writer's side and probes share it), instrumentation suppressed."""

    def __init__(self, inner: SpanExporter, counts: Counts) -> None:
        self.inner = inner
        self.up = True  # what the last request came to
        self._counts = counts
        self._lock = threading.Lock()  # inner.export is called by one thread at a time
        #: sends stored records as they are (the SDK's OTLP exporters), else None
        self.raw = _raw_otlp.raw_sender_for(inner)
        #: the exporter says span by span what its backend did (``export_detailed``)
        self.detailed = callable(getattr(inner, "export_detailed", None))

    def send_stored(self, bodies: list[bytes]) -> str | None:
        """One request of stored records (``_raw_otlp`` outcome; None: decode them instead)."""
        assert self.raw is not None
        with self._lock, suppressed_instrumentation():
            outcome = self.raw.send(bodies)
        if outcome is not None:
            self.up = outcome == _raw_otlp.ACCEPTED
        return outcome

    def send_detailed(self, spans: Sequence[ReadableSpan]) -> _delivery.Delivery:
        """One request whose outcome the exporter tells span by span."""
        with self._lock, suppressed_instrumentation():
            delivery = _delivery.deliver(self.inner, spans)
        self.up = len(delivery.retryable) < len(spans)
        return delivery

    def deliver(self, spans: Sequence[ReadableSpan]) -> bool:
        """One request; True when the backend accepted it."""
        with self._lock:
            return call_export(self.inner, spans)

    def send(self, spans: Sequence[ReadableSpan]) -> bool:
        """A request that tells whether the backend is up (a probe does not)."""
        self.up = self.deliver(spans)
        return self.up

    def send_direct(self, spans: Sequence[ReadableSpan], count_loss: bool = True) -> bool:
        """Deliver ``spans`` now, past the log (counted; a failure as ``spool_failed``)."""
        ok = self.send(spans)
        if ok:
            self._counts.add(delivered=len(spans), requests=1)
        elif count_loss:
            self._counts.add(spool_failed=len(spans))
        return ok


class Sender:
    """Delivers ``log`` to ``inner`` from its own thread (started here).

    ``pending`` counts this process's records not yet delivered (written to the log, or held in
    memory); the log's writer reports them (``appended``, ``hold``, ``forget``).
    """

    def __init__(self, log: SpanLog, inner: SpanExporter, settings: LogSettings,
                 counts: Counts) -> None:
        self._log = log
        self.backend = Backend(inner, counts)
        self._settings = settings
        self._counts = counts
        self._cond = threading.Condition()  # the state below; wakes the thread
        self.pending = 0
        self._oldest_unsent: float | None = None
        self._flush_waiters: list[threading.Event] = []
        self._urgent = False  # nudge(): send what is pending now, not after export_delay_s
        self._stopping = False
        self._deadline: float | None = None
        self._last_failure = 0.0
        self._turn = 0  # round robin over the streams served (adopted ones and this process's)
        self._next_adopt = 0.0
        self._overflow = Overflow(settings.max_overflow_bytes, self._cond)
        self._requests = Requests(log, self.backend, settings, counts, self._own_done)
        self._warned_disk = False
        self._thread = threading.Thread(target=self._run, name="otel_verl-deliver", daemon=True)
        self._thread.start()

    # -- the writer's side ------------------------------------------------------------------------
    def appended(self, count: int, *, urgent: bool) -> None:
        """``count`` records are in the log: wake the thread (at once when ``urgent``)."""
        with self._cond:
            self.pending += count
            if self._oldest_unsent is None:
                self._oldest_unsent = time.monotonic()
            if urgent:
                self._urgent = True
            self._cond.notify_all()

    def forget(self, count: int) -> None:
        """``count`` undelivered records left the log (its budget dropped them)."""
        if count:
            with self._cond:
                self.pending -= count

    def hold(self, lines: list[bytes], spans: list[ReadableSpan], error: OSError) -> bool:
        """The log cannot grow (a full disk): send directly while the backend answers, else hold
        the records in memory (bounded) until the disk or the backend takes them. False: lost
        (counted, ``spool_failed``)."""
        if not self._warned_disk:
            self._warned_disk = True
            _logger.warning("otel_verl: cannot write to the log in %s (%r); sending directly, or "
                            "holding up to %d bytes in memory", self._log.directory, error,
                            self._overflow.max_bytes)
        if self.backend.up and not self._overflow and \
                self.backend.send_direct(spans, count_loss=False):
            return True
        if not self._overflow.offer(lines, spans):
            self._counts.add(spool_failed=len(lines))
            return False
        self.appended(len(lines), urgent=False)
        return True

    @property
    def held_bytes(self) -> int:
        return self._overflow.bytes

    # -- waiting ----------------------------------------------------------------------------------
    def nudge(self) -> None:
        """Send what this process wrote now instead of after ``export_delay_s``."""
        with self._cond:
            if self.pending > 0:
                self._urgent = True
                self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until what was written so far is delivered (False on timeout or an outage)."""
        event = threading.Event()
        with self._cond:
            if not self._busy():
                return True
            self._flush_waiters.append(event)
            self._cond.notify_all()
        return event.wait(timeout_s) and self.pending <= 0

    def stop(self, timeout_s: float) -> bool:
        """Deliver what is left for up to ``timeout_s``, then stop; True when the thread is still
        inside an export (it stops after it)."""
        with self._cond:
            self._stopping = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        self._thread.join(timeout_s + 0.5)
        with self._cond:
            self._deadline = 0.0  # a sender still inside a hung export stops after it
            self._cond.notify_all()
        return self._thread.is_alive()

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cond:
                while True:
                    if self._stopping and (self._deadline is None
                                           or time.monotonic() >= self._deadline
                                           or not self._busy(self._deadline)):
                        self._release_waiters(all_=True)
                        return
                    wait = self._due(time.monotonic(), backoff)
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                backoff_was = backoff
            if self._send_once() == _FAILED:
                backoff = min(self._settings.retry_max_s,
                              max(self._settings.retry_initial_s, backoff_was * 2))
                self._last_failure = time.monotonic()
            else:
                backoff = 0.0
            with self._cond:
                self._release_waiters()

    def _busy(self, until: float = 0.0) -> bool:
        """Something is left to deliver: this process's spans, or an adopted stream that reads
        (or that is to be read again before ``until``)."""
        return self.pending > 0 or any(not s.read_errors or s.retry_at < until
                                       for s in self._log.orphans.streams)

    def _own_wait(self, now: float) -> float:
        """Seconds until this process's stream should be sent from (inf: nothing to send)."""
        if self.pending <= 0:
            return math.inf
        stream = self._log.stream
        limit = stream.limit if stream is not None else self._settings.max_batch_spans
        blocked = stream.retry_at - now if stream is not None else 0.0
        if self.pending >= limit or self._flush_waiters or self._stopping or self._urgent:
            return max(0.0, blocked)
        oldest = self._oldest_unsent or now
        return max(oldest + self._settings.export_delay_s - now, blocked)

    def _due(self, now: float, backoff: float) -> float:
        """Seconds until the thread should try (<= 0: now)."""
        if backoff:
            left = self._last_failure + backoff - now
            if left > 0:
                return left
        if now >= self._next_adopt:
            return 0.0
        waits = [self._own_wait(now), self._next_adopt - now]
        waits.extend(s.retry_at - now for s in self._log.orphans.streams)
        wait = min(waits)
        return wait if wait <= 0 or not self._stopping else min(wait, 0.05)

    def _release_waiters(self, all_: bool = False) -> None:
        if self.pending <= 0:
            self._urgent = False
        if all_ or not self._busy():
            for event in self._flush_waiters:
                event.set()
            self._flush_waiters = []

    def _send_once(self) -> str:
        """One request, taking turns between the adopted streams and this process's own (so that
        no stream, however stuck, holds back the others)."""
        if self._overflow:
            return self._send_overflow()
        now = time.monotonic()
        if now >= self._next_adopt:
            self._next_adopt = now + ADOPT_EVERY_S
            self._log.orphans.adopt(self._log.stream)
        mine = self._log.stream
        ready: list[Stream] = [s for s in self._log.orphans.streams if s.retry_at <= now]
        if mine is not None and self._own_wait(now) <= 0:
            ready.append(mine)
        if not ready:
            return _EMPTY
        stream = ready[self._turn % len(ready)]
        self._turn += 1
        result = self._requests.send_from(stream)
        if result == _EMPTY and stream is mine:
            with self._cond:
                self.pending = self._overflow.records()
                self._oldest_unsent = None if not self.pending else self._oldest_unsent
        elif result == _EMPTY:  # that stream is delivered (what it held was read, every line)
            self._log.orphans.retire(stream)
        return result

    def _send_overflow(self) -> str:
        """The thread's side of ``hold``."""
        result, delivered = self._overflow.send_first(self._log, self.backend, self._counts)
        if delivered:
            with self._cond:
                self.pending -= delivered
        return result

    def _own_done(self, count: int, read_all: bool | None = None) -> None:
        """``count`` of this process's records are done with (delivered or kept aside);
        ``read_all``: whether the request held all that was written when it was read (None: the
        time of the oldest unsent span stays)."""
        with self._cond:
            self.pending -= count
            if read_all is None:
                return
            if self.pending <= 0:
                self._oldest_unsent = None
            elif read_all:
                self._oldest_unsent = time.monotonic()  # all of it written since the read
            # else the read stopped short of what was written (a backlog, or a request full
            # by bytes): the rest has waited at least since the oldest unsent span did, so
            # it does not wait export_delay_s again (the same process waited it after every
            # request of a backlog full by bytes, and for the rest of any backlog)


class Requests:
    """One request from a stream and what it came to: stored bytes or decoded spans, the typed
    outcome or poison probing, the outage warning. ``own_done`` (the sender's) is told when
    records of this process's stream are done with."""

    def __init__(self, log: SpanLog, backend: Backend, settings: LogSettings, counts: Counts,
                 own_done: Callable[[int, bool | None], None]) -> None:
        self._log = log
        self.backend = backend
        self._settings = settings
        self._counts = counts
        self._own_done = own_done
        self._probe = PoisonProbe(log, backend.deliver)
        self._outage_warned = False

    def send_from(self, stream: Stream) -> str:
        """Send one request from ``stream``: ``_EMPTY`` (nothing left), ``_SENT``, ``_FAILED``
        (the backend did not accept it) or ``_BLOCKED`` (the stream cannot be read now)."""
        own = stream is self._log.stream
        backend = self.backend
        batch = self._log.read(stream, stored=backend.raw is not None)
        if batch is None:
            return _BLOCKED
        if not batch.count:
            return _EMPTY
        outcome = backend.send_stored(batch.bodies) if batch.bodies is not None else None
        if batch.bodies is not None and outcome is None:  # a record it cannot write as it is
            try:
                batch.spans = self._log.decode(stream, batch.lines)
            except OSError:
                return _BLOCKED
        spans = batch.spans
        delivery = None
        if outcome is not None:
            ok = outcome == _raw_otlp.ACCEPTED
        elif spans and backend.detailed:
            delivery = backend.send_detailed(spans)
            ok = delivery.ok
        else:
            ok = backend.send(spans) if spans else True
        if ok:
            sent = backend.raw.last_spans if outcome is not None and backend.raw else len(spans)
            if sent:
                # the canary of poison probing: the request's last span (decoded only here)
                self._probe.accepted(spans or self._log.decode(stream, batch.lines[-1:], False))
            return self._settled(batch, sent)
        typed = delivery is not None and len(spans) == batch.count  # one span per record
        if typed and self._typed(batch, delivery):
            return _SENT
        self._counts.add(retries=1)
        if not self._outage_warned:
            self._outage_warned = True
            _logger.warning("otel_verl: the backend did not accept %d span(s); they wait in %s "
                            "and are retried (replay by hand: `otel-verl traces replay %s`)",
                            batch.count, self._log.directory, self._log.directory)
        if outcome == _raw_otlp.RETRY or typed:
            return _FAILED  # an outage (or a failing backend), not a refused span: no halving
        lines = self._log.stored_lines(batch)
        if len(lines) > 1:
            stream.limit = max(1, len(lines) // 2)  # find a span the backend refuses, if any
        elif lines and self._probe.refused_alone(batch, lines[0]) and own:
            self._own_done(1, None)
        return _FAILED

    def _settled(self, batch: Batch, delivered: int) -> str:
        """Every record of ``batch`` is done with (``delivered`` spans accepted): move on."""
        stream = batch.stream
        own = stream is self._log.stream
        if delivered:
            self._counts.add(delivered=delivered, requests=1, request_bytes=batch.size)
            if not own:
                self._counts.add(recovered=delivered)
        self._log.commit(stream, batch.after)
        if own:
            self._own_done(batch.count, batch.end is None or batch.after >= batch.end)
        stream.limit = min(self._settings.max_batch_spans, stream.limit * 2)
        if self._outage_warned and delivered:
            self._outage_warned = False
            _logger.warning("otel_verl: the backend accepts spans again; delivering the log")
        return _SENT

    def _typed(self, batch: Batch, delivery: _delivery.Delivery | None) -> bool:
        """What the exporter said of each span (one per record): the refused ones go to
        quarantine at once, no probing. False: something waits for the next attempt (what the
        exporter called retryable, or a refused record that could not be kept aside)."""
        assert delivery is not None
        stream = batch.stream
        settled = _delivery.settle(delivery, range(batch.count), batch.count)
        if settled.retry:
            if settled.done:  # next time the settled records go alone, and settle
                stream.limit = settled.done
            return False
        lines = self._log.stored_lines(batch)
        if len(lines) != batch.count:
            return False  # cannot be read back now: the whole batch is tried again
        for record, reason in settled.rejected:
            _logger.warning("otel_verl: the backend refused a span for good (%s)", reason[:300])
            if not self._log.quarantine(stream, lines[record], stream.cursor):
                return False  # not kept aside: it stays in the log, tried again
        if settled.delivered:
            self._probe.accepted(batch.spans)
        self._settled(batch, settled.delivered)
        return True
