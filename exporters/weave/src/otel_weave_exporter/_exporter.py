"""``WeaveSpanExporter``: finished spans -> Weave complete calls over HTTP.

``export`` runs on the span processor's thread (``BatchSpanProcessor``'s worker, never the
application's when used the recommended way): it translates, encodes, splits and POSTs within
``timeout_s``, and returns SUCCESS or FAILURE; it never raises. What could not be delivered is
counted and, with a spool directory, written to disk for replay.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_weave_exporter import _conventions as c
from otel_weave_exporter._content_objects import content_calls, publish_pending
from otel_weave_exporter._deliver import SpanDelivery, deliver
from otel_weave_exporter._encode import encode_call
from otel_weave_exporter._running import (
    RunningCalls,
    body,
    eager_path,
    end_of,
    in_flight_op_id,
    start_call,
)
from otel_weave_exporter._spool import Spool
from otel_weave_exporter._translate import Translator
from otel_weave_exporter._transport import HttpSender, basic_auth

_log = logging.getLogger("otel_weave_exporter")

#: ``stats()`` keys: otel_verl's names (``otel_verl.exporters``) where they mean the same thing;
#: one call per span
STATS_KEYS: tuple[str, ...] = (
    "received",  # spans handed to export()
    "delivered",  # calls the server accepted
    "undelivered",  # calls export() could not deliver: spooled + quarantined + spool_failed
    "spooled",  # of those, written to the spool for replay
    "quarantined",  # of those, refused by the server as invalid: kept aside, never retried
    "spool_failed",  # of those, kept nowhere (no spool_dir, spool full, disk error): lost
    "truncated",  # calls shrunk to fit max_call_bytes (delivered, marked)
    "skipped",  # trajectory spans dropped by design (keep_trajectory_spans=False)
    "translate_failed",  # spans whose translation raised (a bug of ours; logged)
    "dropped_after_shutdown",  # spans handed to export() after shutdown()
    "dropped_busy",  # spans refused because an export held the lock past timeout_s
    "requests",  # requests the server accepted
    "retries",  # failed attempts (retried within timeout_s, or given up)
)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True)
class ExporterConfig:
    """Everything the exporter runs with, resolved once (argument > environment > default)."""

    entity: str
    project: str
    api_key: str = field(repr=False)
    base_url: str
    #: bound of one export() call (all retries included), seconds
    timeout_s: float = 10.0
    #: bound of one HTTP request, seconds (capped by what is left of timeout_s)
    request_timeout_s: float = 10.0
    #: bound of shutdown() / the default force_flush wait, seconds
    shutdown_timeout_s: float = 5.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    max_request_bytes: int = c.MAX_REQUEST_BYTES
    max_call_bytes: int = c.MAX_CALL_BYTES
    #: otel_verl's trajectory span is the trajectory's one root call (False: dropped, its
    #: children become roots, verl's own tree shape)
    keep_trajectory_spans: bool = True
    include_otel_attributes: bool = True
    summary_rollup: bool = True
    #: thread_id = the trajectory, turn_id on each LLM turn (Weave's Threads view)
    threads: bool = True
    #: the W&B run the calls belong to (``run`` or ``entity/project/run``); else the wandb run
    #: active in this process, if any
    wandb_run_id: str | None = None
    spool_dir: str | None = None
    max_spool_bytes: int = 1 << 30
    headers: Mapping[str, str] = field(default_factory=dict)
    #: otel_verl's per-turn content as Weave objects referenced from the calls (docs/weave.md);
    #: ``content_dir`` is its content store (deltas beyond a span's cap), ``content_flush`` what
    #: writes out the store's buffered nodes before a miss is looked up again
    content_objects: bool = True
    content_inline_bytes: int = 2048
    content_dir: str | None = None
    content_flush: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def project_id(self) -> str:
        return f"{self.entity}/{self.project}"

    @property
    def path(self) -> str:
        return f"/v2/{self.entity}/{self.project}/calls/complete"


_OPTION_NAMES = frozenset(f.name for f in fields(ExporterConfig)) - {
    "entity",
    "project",
    "api_key",
    "base_url",
}


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
        if value <= 0:
            raise ValueError
        return value
    except ValueError:
        _log.warning("ignoring %s=%r: not a positive number; using %s", name, raw, default)
        return default


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    _log.warning("ignoring %s=%r: not a boolean; using %s", name, raw, default)
    return default


def default_trace_server_url() -> str:
    """Weave's own rule (weave/trace/env.py): WF_TRACE_SERVER_URL, else the public trace
    server for the public W&B, else ``{WANDB_BASE_URL}/traces`` for dedicated deployments."""
    explicit = os.environ.get(c.WF_TRACE_SERVER_URL)
    if explicit:
        return explicit
    base = (
        os.environ.get(c.WANDB_PUBLIC_BASE_URL, "").rstrip("/")
        or os.environ.get(c.WANDB_BASE_URL, c.DEFAULT_WANDB_BASE_URL).rstrip("/")
    )
    return c.DEFAULT_TRACE_SERVER_URL if base == c.DEFAULT_WANDB_BASE_URL else base + "/traces"


def _wandb_base_url() -> str:
    return os.environ.get(c.WANDB_BASE_URL, c.DEFAULT_WANDB_BASE_URL).rstrip("/")


def default_entity(api_key: str, timeout_s: float = 5.0) -> str | None:
    """The API key's default entity (W&B GraphQL ``viewer.defaultEntity``), or None."""
    import json
    import urllib.request

    query = b'{"query": "query DefaultEntity { viewer { username defaultEntity { name } } }"}'
    req = urllib.request.Request(
        _wandb_base_url() + "/graphql",
        data=query,
        headers={"Content-Type": "application/json", "Authorization": basic_auth(api_key)},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            doc = json.loads(resp.read(1 << 20))
        name = ((doc.get("data") or {}).get("viewer") or {}).get("defaultEntity", {}).get("name")
        return str(name) if name else None
    except Exception as exc:  # no network, bad key, odd answer: the caller raises a clear error
        _log.warning("otel-weave-exporter: could not read the default W&B entity: %s", exc)
        return None


def resolve_config(
    project: str | None = None,
    entity: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    **options: Any,
) -> ExporterConfig:
    """Build the frozen config; bad explicit values raise, bad environment values warn."""
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TypeError(
            f"WeaveSpanExporter got unknown option(s) {sorted(unknown)}; known: {sorted(_OPTION_NAMES)}"
        )
    project = project if project is not None else (
        os.environ.get(c.ENV_PROJECT) or os.environ.get(c.WANDB_PROJECT)
    )
    if not project:
        raise ValueError(
            f"WeaveSpanExporter needs a project: pass project=... or set {c.ENV_PROJECT} "
            f"(\"project\" or \"entity/project\")"
        )
    if "/" in project:
        head, _, project = project.partition("/")
        if entity is None:
            entity = head
        if "/" in project or not project or not head:
            raise ValueError(f"project must be 'project' or 'entity/project', got {head}/{project}")
    api_key = api_key if api_key is not None else os.environ.get(c.WANDB_API_KEY)
    if not api_key:
        raise ValueError(
            f"WeaveSpanExporter needs a W&B API key: set {c.WANDB_API_KEY} (or pass api_key=...); "
            "it never prompts for one"
        )
    entity = entity if entity is not None else os.environ.get(c.WANDB_ENTITY)
    if not entity:
        # like weave.init(project): the key's default entity, asked once from the W&B API
        entity = default_entity(api_key)
    if not entity:
        raise ValueError(
            f"WeaveSpanExporter needs a W&B entity for project {project!r}: pass entity=..., "
            f"use project='entity/{project}', or set {c.WANDB_ENTITY} (the default entity of the "
            f"API key could not be read from {_wandb_base_url()}/graphql)"
        )
    if base_url is None:
        base_url = os.environ.get(c.ENV_ENDPOINT) or default_trace_server_url()

    defaults: dict[str, Any] = {
        "timeout_s": _env_float(c.ENV_TIMEOUT, 10.0),
        "keep_trajectory_spans": _env_bool(c.ENV_KEEP_TRAJECTORY, True),
        "threads": _env_bool(c.ENV_THREADS, True),
        "spool_dir": os.environ.get(c.ENV_SPOOL_DIR) or None,
        "wandb_run_id": os.environ.get(c.WANDB_RUN_ID) or None,
        "content_dir": os.environ.get(c.ENV_CONTENT_DIR) or None,
        "content_inline_bytes": int(_env_float(c.ENV_CONTENT_INLINE_BYTES, 2048)),
    }
    merged = {**defaults, **options}
    for name in ("timeout_s", "request_timeout_s", "shutdown_timeout_s", "max_request_bytes",
                 "max_call_bytes", "content_inline_bytes"):
        if name in merged and not (isinstance(merged[name], (int, float)) and merged[name] > 0):
            raise ValueError(f"{name} must be a positive number, got {merged[name]!r}")
    cfg = ExporterConfig(
        entity=entity, project=project, api_key=api_key, base_url=base_url.rstrip("/"), **merged
    )
    if cfg.max_call_bytes > cfg.max_request_bytes - 64:
        raise ValueError("max_call_bytes must be smaller than max_request_bytes")
    return cfg


@dataclass
class _Eager:
    """A running call's start or end: one request (``_running``)."""

    index: int  # the span's index in the export
    kind: str  # "start" | "end"
    call_id: str
    body: bytes
    #: an end's complete call (spooled when the end cannot be sent)
    complete: bytes | None = None


class WeaveSpanExporter(SpanExporter):
    """OpenTelemetry span exporter writing each finished span to W&B Weave as a complete call.

    Args:
        project: ``"project"`` or ``"entity/project"``; default ``$OTEL_EXPORTER_WEAVE_PROJECT``
            (then ``$WANDB_PROJECT``).
        entity: W&B entity; default the ``entity/`` part of ``project``, then ``$WANDB_ENTITY``.
        api_key: default ``$WANDB_API_KEY``; a missing key raises ``ValueError`` here (no prompt).
        base_url: the Weave trace server; default ``$OTEL_EXPORTER_WEAVE_ENDPOINT``, then weave's
            own rule (``$WF_TRACE_SERVER_URL``, ``$WANDB_BASE_URL``/traces, https://trace.wandb.ai).
        **options: any :class:`ExporterConfig` field (``timeout_s``, ``max_call_bytes``,
            ``keep_trajectory_spans``, ``spool_dir``, ...). Unknown names raise ``TypeError``.
    """

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        **options: Any,
    ) -> None:
        self.config = cfg = resolve_config(project, entity, api_key, base_url, **options)
        self._translator = Translator(
            cfg.entity,
            cfg.project,
            keep_trajectory_spans=cfg.keep_trajectory_spans,
            include_otel_attributes=cfg.include_otel_attributes,
            summary_rollup=cfg.summary_rollup,
            threads=cfg.threads,
            wandb_run_id=cfg.wandb_run_id,
            content=content_calls(cfg.entity, cfg.project, cfg.content_objects, cfg.content_dir,
                                  cfg.content_flush, cfg.content_inline_bytes),
        )
        self._sender = HttpSender(
            cfg.base_url,
            {"Authorization": basic_auth(cfg.api_key), **cfg.headers},
            request_timeout_s=cfg.request_timeout_s,
            backoff_initial_s=cfg.backoff_initial_s,
            backoff_max_s=cfg.backoff_max_s,
        )
        self._spool = Spool(cfg.spool_dir, cfg.max_spool_bytes) if cfg.spool_dir else None
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._closed = threading.Event()
        # the core's vocabulary (otel_verl's processors use the same keys); one call per span
        self._stats = dict.fromkeys(STATS_KEYS, 0)
        #: calls started from otel_verl's in-flight spans, ended when their op's span comes
        #: (``_running``; docs/weave.md "Running calls")
        self._running = RunningCalls()

    # -- public -----------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Counters since construction (a copy), keyed as :data:`STATS_KEYS` describes."""
        with self._stats_lock:
            return dict(self._stats)

    def content_stats(self) -> dict[str, int]:
        """The per-turn content counters (``_content_objects.ContentCalls.stats``); {} when off."""
        content = self._translator.content
        return dict(content.stats) if content is not None else {}

    def running_stats(self) -> dict[str, int]:
        """Running calls (``_running``): starts accepted, of them already there, ends, starts
        that were not needed."""
        with self._stats_lock:
            return dict(self._running.stats)

    @property
    def spool_path(self) -> str | None:
        return str(self._spool.path) if self._spool is not None else None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Translate and deliver ``spans`` within ``timeout_s``; never raises."""
        try:
            return self._export(spans)
        except Exception:  # a bug of ours: never into the caller
            _log.exception("otel-weave-exporter: unexpected error in export")
            return SpanExportResult.FAILURE

    def export_detailed(self, spans: Sequence[ReadableSpan]) -> SpanDelivery:
        """Deliver ``spans`` like :meth:`export`, and say what became of each; never raises.

        For a caller that keeps what was not delivered itself (otel_verl's durable log): nothing
        is written to this exporter's own spool. A span whose call the server refused on its
        own as invalid (400/422, or 413 for one call), or that could not be translated, is
        *rejected* (never worth retrying); what was not sent because the server is down, failed
        past the deadline, or the exporter is shut down or busy, is *retryable*.
        """
        try:
            return self._export_detailed(spans)
        except Exception:  # a bug of ours: never into the caller; the caller retries
            _log.exception("otel-weave-exporter: unexpected error in export_detailed")
            return SpanDelivery(retryable=tuple(range(len(spans))))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered between exports; waits (bounded) for an export in flight."""
        if self._lock.acquire(timeout=max(timeout_millis, 0) / 1000.0):
            self._lock.release()
            return True
        return False

    def shutdown(self) -> None:
        """Idempotent; returns within ``shutdown_timeout_s`` even if a request hangs."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._sender.abort()
        if self._lock.acquire(timeout=self.config.shutdown_timeout_s):
            try:
                self._sender.close()
            finally:
                self._lock.release()
        st = self.stats()
        refused = st["dropped_after_shutdown"] + st["dropped_busy"]
        if st["undelivered"] or refused:
            where = f"; {st['spooled']} spooled to {self.spool_path}" if self._spool else ""
            _log.warning(
                "otel-weave-exporter: %d call(s) were not delivered to Weave%s; %d quarantined as "
                "invalid; %d span(s) refused",
                st["undelivered"],
                where,
                st["quarantined"],
                refused,
            )

    # -- internals --------------------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                self._stats[k] += v

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed.is_set():
            self._count(dropped_after_shutdown=len(spans))
            return SpanExportResult.FAILURE
        deadline = time.monotonic() + self.config.timeout_s
        if not self._lock.acquire(timeout=self.config.timeout_s):
            self._count(dropped_busy=len(spans))
            return SpanExportResult.FAILURE
        try:
            eager: list[_Eager] = []
            parts, truncated, skipped, bad = self._encode(spans, eager=eager)
            self._count(
                received=len(spans), truncated=truncated, skipped=skipped, translate_failed=bad
            )
            eager_ok = self._deliver_eager_or_spool(eager, deadline)
            if not parts:
                ok = not bad and eager_ok
                return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE
            result = self._deliver(parts, deadline)
            return result if eager_ok else SpanExportResult.FAILURE
        finally:
            self._lock.release()

    def _export_detailed(self, spans: Sequence[ReadableSpan]) -> SpanDelivery:
        every = tuple(range(len(spans)))
        if self._closed.is_set():
            self._count(dropped_after_shutdown=len(spans))
            return SpanDelivery(retryable=every)
        deadline = time.monotonic() + self.config.timeout_s
        if not self._lock.acquire(timeout=self.config.timeout_s):
            self._count(dropped_busy=len(spans))
            return SpanDelivery(retryable=every)
        try:
            owners: list[int] = []
            bad: list[int] = []
            eager: list[_Eager] = []
            parts, truncated, skipped, _ = self._encode(spans, owners, bad, eager)
            self._count(received=len(spans), truncated=truncated, skipped=skipped,
                        translate_failed=len(bad))
            rejected = [(i, "the span could not be translated into a Weave call") for i in bad]
            eager_rejected, eager_retry = self._deliver_eager(eager, deadline)
            rejected += eager_rejected
            done = deliver(self._sender, self.config.path, parts, self.config.max_request_bytes,
                           deadline) if parts else None
        finally:
            self._lock.release()
        if done is None:
            unsent = set(bad) | {i for i, _ in eager_rejected} | set(eager_retry)
            return SpanDelivery(accepted=tuple(i for i in every if i not in unsent),
                                rejected=tuple(rejected), retryable=tuple(eager_retry))
        self._count(requests=done.requests, retries=done.retries, delivered=done.sent)
        owner = {id(part): index for part, index in zip(parts, owners, strict=True)}
        if len(owner) < len(parts):  # two calls as one object: cannot tell them apart; retry
            return SpanDelivery(retryable=every)
        rejected += [(owner[id(part)], error) for part, error in done.rejected]
        retryable = [owner[id(part)] for part in done.failed] + eager_retry
        settled = {i for i, _ in rejected} | set(retryable)
        return SpanDelivery(accepted=tuple(i for i in every if i not in settled),
                            rejected=tuple(rejected), retryable=tuple(retryable))

    def _encode(self, spans: Sequence[ReadableSpan], owners: list[int] | None = None,
                failed: list[int] | None = None, eager: list[_Eager] | None = None
                ) -> tuple[list[bytes], int, int, int]:
        """The calls of ``spans``; with ``owners``, the index of each call's span is appended
        there (and with ``failed``, the index of each span that could not be translated).

        Running calls (``_running``): an in-flight span becomes the start of its op's call, and
        the span of an op whose call was started becomes that call's end; both go to ``eager``
        (dropped when it is None: nothing then starts a call)."""
        tr = self._translator
        tr.begin_batch(spans)
        running = self._running
        max_call = self.config.max_call_bytes
        parts: list[bytes] = []
        truncated = skipped = bad = 0
        here: set[int] | None = None
        for index, span in enumerate(spans):
            try:
                op_id = in_flight_op_id(span)
                if op_id is not None:  # the start of the stuck op's call, not a call of its own
                    if here is None:
                        here = {s.context.span_id for s in spans}
                    if (eager is None or int(op_id, 16) in here or running.is_ended(op_id)
                            or running.is_started(op_id)):
                        running.stats["starts_skipped"] += 1  # ended (or started) already
                        continue
                    data, cut = encode_call(start_call(tr, span, op_id), max_call)
                    eager.append(_Eager(index, "start", op_id, body("start", data)))
                    truncated += cut
                    continue
                call = tr.translate(span)
                if call is None:
                    skipped += 1
                    continue
                data, cut = encode_call(call, max_call)
                running.ended(call["id"])
                if eager is not None and running.is_started(call["id"]):
                    end, _ = encode_call(end_of(call), max_call)
                    eager.append(_Eager(index, "end", call["id"], body("end", end), data))
                    truncated += cut
                    continue
            except Exception:
                bad += 1
                if failed is not None:
                    failed.append(index)
                _log.exception("otel-weave-exporter: could not translate span %r", span.name)
                continue
            truncated += cut
            parts.append(data)
            if owners is not None:
                owners.append(index)
        publish_pending(tr.content, self._sender, self.config.timeout_s)  # before their calls
        return parts, truncated, skipped, bad

    def _deliver_eager(self, eager: list[_Eager], deadline: float
                       ) -> tuple[list[tuple[int, str]], list[int]]:
        """Send the starts and ends of running calls, one request each (as Weave's client does
        for eager calls); (rejected, retryable) span indices. A start the server answers 409
        (the id exists) is already done. After the first failure that may pass, the rest are
        retryable without being tried."""
        rejected: list[tuple[int, str]] = []
        retry: list[int] = []
        requests = retries = 0
        for item in eager:
            if retry:
                retry.append(item.index)
                continue
            result = self._sender.send(eager_path(self.config.path, item.kind), item.body,
                                       deadline)
            retries += result.attempts - (1 if result.ok else 0)
            conflict = item.kind == "start" and result.status == 409
            if result.ok or conflict:
                requests += result.ok
                with self._stats_lock:
                    if item.kind == "start":
                        self._running.started(item.call_id)
                        self._running.stats["started"] += 1
                        self._running.stats["start_conflicts"] += conflict
                    else:
                        self._running.stats["ended"] += 1
                if item.kind == "end":
                    self._count(delivered=1)
            elif result.rejected or result.too_large:
                rejected.append((item.index, result.error))
            else:
                retry.append(item.index)
        self._count(requests=requests, retries=retries)
        return rejected, retry

    def _deliver_eager_or_spool(self, eager: list[_Eager], deadline: float) -> bool:
        """``_deliver_eager`` for ``export``: an end that could not be sent is spooled as its
        complete call (a replay answered 409 ends the call); a start that could not be sent is
        only logged (the op's complete call comes when it ends). True when all went."""
        if not eager:
            return True
        rejected, retry = self._deliver_eager(eager, deadline)
        by_index = {item.index: item for item in eager}
        unsent = [by_index[i].complete for i in retry if by_index[i].complete is not None]
        if unsent:
            self._undeliverable([p for p in unsent if p is not None], "the end of a running call")
        for index, error in rejected:
            _log.warning("otel-weave-exporter: the %s of running call %s was refused (%s)",
                         by_index[index].kind, by_index[index].call_id, error[:300])
        return not rejected and not retry

    def _deliver(self, parts: list[bytes], deadline: float) -> SpanExportResult:
        """POST in request-sized batches (see ``_deliver``): one call the server refuses as
        invalid costs only itself (quarantined); the first other failure ends the export and
        everything left is spooled."""
        done = deliver(self._sender, self.config.path, parts, self.config.max_request_bytes,
                       deadline)
        self._count(requests=done.requests, retries=done.retries, delivered=done.sent)
        if done.rejected:
            kept = self._spool.quarantine(done.rejected) if self._spool is not None else 0
            self._count(undelivered=len(done.rejected), quarantined=kept,
                        spool_failed=len(done.rejected) - kept)
            _log.warning(
                "otel-weave-exporter: %d call(s) refused as invalid (%s); %d quarantined%s",
                len(done.rejected), done.rejected[0][1][:300], kept,
                f" in {self._spool.rejected_path}" if self._spool is not None else
                " (no spool_dir set)",
            )
        if done.failed:
            self._undeliverable(done.failed, done.error)
        ok = not done.rejected and not done.failed
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _undeliverable(self, parts: list[bytes], error: str) -> None:
        spooled = self._spool.write(parts) if self._spool is not None else 0
        self._count(undelivered=len(parts), spooled=spooled, spool_failed=len(parts) - spooled)
        _log.warning(
            "otel-weave-exporter: %d call(s) not delivered (%s); %d spooled%s",
            len(parts),
            error,
            spooled,
            f" to {self._spool.path}" if self._spool is not None else " (no spool_dir set)",
        )
