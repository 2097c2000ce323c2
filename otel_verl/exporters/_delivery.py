"""Typed delivery outcomes: which spans a backend accepted, refused for good, or may take later.

A ``SpanExportResult`` says SUCCESS or FAILURE for a whole batch. An exporter that knows more
(the Weave exporter knows which call its server refused as invalid) can say so with an optional
method, as the Collector's ``consumererror.NewPermanent`` marks an error no retry can fix::

    class MyExporter(SpanExporter):
        def export_detailed(self, spans) -> Delivery:  # any object with these three attributes
            ...
            return Delivery(accepted=(0, 2), rejected=((1, "400: not JSON"),), retryable=())

Each field holds indices into ``spans``: ``accepted`` (delivered), ``rejected`` (``(index,
reason)`` pairs: refused for good, never to be retried; the durable log moves them to quarantine
at once) and ``retryable`` (not delivered now, worth sending again). :func:`deliver` calls
``export_detailed`` when the exporter has it and checks what it answered; otherwise it calls
``export`` and reads SUCCESS as all accepted and FAILURE as all retryable (the durable log then
falls back to probing by strikes to find a span the backend refuses). The Weave exporter's
method returns its own object of the same shape (it does not depend on otel_verl).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_verl import _errors

__all__ = ["LOSS_KEYS", "DetailedExporter", "Delivery", "DeliveryLike", "deliver"]

#: the statistics keys that count spans which were not delivered (the table in
#: ``otel_verl/exporters/__init__.py``; re-exported there and by ``otel_verl._state``)
LOSS_KEYS = ("dropped_queue_full", "dropped_after_shutdown", "dropped_transform_failed",
             "export_failed", "abandoned_at_shutdown", "spool_failed", "dropped_spool_full",
             "quarantined")


@dataclass(frozen=True)
class Delivery:
    """What became of each span of one export (indices into the spans handed over).

    Attributes:
        accepted: delivered (or dropped by the exporter's own design: nothing left to do).
        rejected: ``(index, reason)`` for each span the backend refused for good.
        retryable: not delivered now; sending them again may succeed.
        detailed: the exporter said this span by span (False: read from SUCCESS/FAILURE).
    """

    accepted: tuple[int, ...] = ()
    rejected: tuple[tuple[int, str], ...] = ()
    retryable: tuple[int, ...] = ()
    detailed: bool = False

    @property
    def ok(self) -> bool:
        """Every span was accepted."""
        return not self.rejected and not self.retryable

    @classmethod
    def of_result(cls, count: int, success: bool) -> Delivery:
        """All ``count`` spans accepted (``success``) or all retryable."""
        every = tuple(range(count))
        return cls(accepted=every) if success else cls(retryable=every)


class DeliveryLike(Protocol):
    """The shape ``export_detailed`` returns (an exporter may use its own class)."""

    @property
    def accepted(self) -> Sequence[int]: ...

    @property
    def rejected(self) -> Sequence[tuple[int, str]]: ...

    @property
    def retryable(self) -> Sequence[int]: ...


@runtime_checkable
class DetailedExporter(Protocol):
    """An exporter that says, span by span, what its backend did with a batch."""

    def export_detailed(self, spans: Sequence[ReadableSpan]) -> DeliveryLike: ...


def deliver(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> Delivery:
    """Export ``spans`` and say what became of each; never raises.

    Uses ``exporter.export_detailed`` when it has one, else ``exporter.export``. The answer is
    checked, never trusted: an index it leaves out, or names as retryable as well, is retryable;
    one named both rejected and accepted counts as rejected; indices out of range are ignored;
    an answer that is not of the shape (or a method that raises) makes the whole batch
    retryable. The caller suppresses instrumentation around it, as around ``export``.
    """
    count = len(spans)
    method = getattr(exporter, "export_detailed", None)
    if not callable(method):
        try:
            result = exporter.export(spans)
        except Exception as exc:  # noqa: BLE001  # an exporter must not raise: this batch failed
            _errors.internal_error(exc, "exporter.export raised")
            return Delivery.of_result(count, False)
        return Delivery.of_result(count, result is SpanExportResult.SUCCESS)
    try:
        answer = method(spans)
        return _checked(answer, count)
    except Exception as exc:  # noqa: BLE001  # never into the sender: the batch is retried
        _errors.internal_error(exc, "exporter.export_detailed raised or answered out of shape")
        return Delivery(retryable=tuple(range(count)), detailed=True)


def _checked(answer: Any, count: int) -> Delivery:
    """``answer``'s three fields as a :class:`Delivery`, each index used once, every index used."""
    seen: set[int] = set()
    accepted: list[int] = []
    rejected: list[tuple[int, str]] = []
    for index, reason in answer.rejected:
        if _fresh(index, count, seen):
            rejected.append((index, str(reason)))
    for index in answer.accepted:
        if _fresh(index, count, seen):
            accepted.append(index)
    for index in answer.retryable:
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count:
            seen.discard(index)  # named retryable too: it may not have arrived, send it again
    retryable = [i for i in range(count) if i not in seen]
    retry = set(retryable)
    return Delivery(accepted=tuple(i for i in accepted if i not in retry),
                    rejected=tuple(r for r in rejected if r[0] not in retry),
                    retryable=tuple(retryable), detailed=True)


def _fresh(index: object, count: int, seen: set[int]) -> bool:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count \
            or index in seen:
        return False
    seen.add(index)
    return True


@dataclass(frozen=True)
class Settled:
    """A delivery read record by record (a log record holds one span, or several: older logs).

    Attributes:
        done: how many records from the start are settled (every span accepted or rejected):
            the cursor may move past them.
        rejected: ``(record, reason)`` for each settled record with a span refused for good
            (quarantined whole, never retried).
        delivered: spans accepted among the settled records.
        retry: records from ``done`` on wait for another attempt (a span of ``done`` was
            retryable).
    """

    done: int
    rejected: tuple[tuple[int, str], ...]
    delivered: int
    retry: bool


def settle(delivery: Delivery, records: Sequence[int], count: int) -> Settled:
    """``delivery`` of spans whose records are ``records`` (``records[i]``: the record of span
    ``i``, in order), over ``count`` records (a record with no span, like a damaged one kept
    aside, is settled as it is)."""
    retry_from = count
    for index in delivery.retryable:
        retry_from = min(retry_from, records[index])
    reasons: dict[int, str] = {}
    for index, reason in delivery.rejected:
        record = records[index]
        if record < retry_from:
            reasons.setdefault(record, reason)
    delivered = sum(1 for index in delivery.accepted if records[index] < retry_from)
    return Settled(done=retry_from, rejected=tuple(sorted(reasons.items())),
                   delivered=delivered, retry=retry_from < count)
