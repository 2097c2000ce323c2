"""``WeaveOtlpSpanExporter``: the same spans through Weave's own OTel ingestion.

Weave ingests OTLP itself (``POST {trace server}/otel/v1/traces``, protobuf) and maps spans to
calls with its own code. This exporter sends there through the standard OTLP/HTTP exporter
(``pip install 'otel-weave-exporter[otlp]'``) and adds, on a copy of each span, the ``wandb.*``
attributes that mapping reads, filled by the same rules as :class:`WeaveSpanExporter`:

* ``wandb.attributes.X`` for every ``rollout.X`` (so ``attributes.step`` & co. filter as in verl);
* ``wandb.wb_run_step`` = ``rollout.step``; ``wandb.wb_run_id`` = the configured or active run;
* ``wandb.thread_id`` = the trajectory and ``wandb.is_turn`` on each LLM turn (Threads view);
* resource ``wandb.entity`` / ``wandb.project`` and the ``project_id`` / ``wandb-api-key``
  headers (project routing, auth; both forms Weave documents).

Everything else is Weave's mapping, not ours (``docs/weave.md`` compares the two paths).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_weave_exporter import _conventions as c
from otel_weave_exporter._exporter import resolve_config
from otel_weave_exporter._translate import (
    TurnTracker,
    current_wandb_run_id,
    thread_key,
)
from otel_weave_exporter._transport import basic_auth

#: the path of Weave's OTel ingestion under the trace server URL
OTEL_TRACES_PATH = "/otel/v1/traces"


class WeaveOtlpSpanExporter(SpanExporter):
    """OTLP/HTTP to Weave's ``/otel/v1/traces``, with Weave's ``wandb.*`` conventions added.

    Args: as :class:`WeaveSpanExporter` (``project``, ``entity``, ``api_key``, ``base_url``;
    options ``timeout_s``, ``threads``, ``wandb_run_id``, ``headers``; the call-only options
    are accepted and ignored).
    """

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        **options: Any,
    ) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ImportError(
                "WeaveOtlpSpanExporter needs the OTLP/HTTP exporter: "
                "pip install 'otel-weave-exporter[otlp]' (opentelemetry-exporter-otlp-proto-http)"
            ) from None
        self.config = cfg = resolve_config(project, entity, api_key, base_url, **options)
        self.endpoint = cfg.base_url + OTEL_TRACES_PATH
        headers = {
            "wandb-api-key": cfg.api_key,
            "Authorization": basic_auth(cfg.api_key),
            "project_id": cfg.project_id,
            **cfg.headers,
        }
        self._inner: SpanExporter = OTLPSpanExporter(
            endpoint=self.endpoint, headers=headers, timeout=cfg.timeout_s
        )
        self._turns = TurnTracker()
        self._resources: dict[int, tuple[Resource, Resource]] = {}
        self._run_id = (cfg.wandb_run_id or "").rsplit("/", 1)[-1] or None

    def _resource(self, res: Resource) -> Resource:
        cached = self._resources.get(id(res))
        if cached is not None and cached[0] is res:
            return cached[1]
        merged = res.merge(Resource({
            c.WANDB_RESOURCE_ENTITY: self.config.entity,
            c.WANDB_RESOURCE_PROJECT: self.config.project,
        }))
        if len(self._resources) > 64:
            self._resources.clear()
        self._resources[id(res)] = (res, merged)
        return merged

    def enrich(self, span: ReadableSpan, run_id: str | None) -> ReadableSpan:
        """A copy of ``span`` with the ``wandb.*`` attributes Weave's OTel mapping reads."""
        attrs: dict[str, Any] = dict(span.attributes or {})
        plen = len(c.ROLLOUT_PREFIX)
        for key, value in list(attrs.items()):
            if key.startswith(c.ROLLOUT_PREFIX):
                attrs[c.WANDB_ATTRIBUTES_PREFIX + key[plen:]] = value
        step = attrs.get(c.ROLLOUT_STEP)
        if isinstance(step, int) and not isinstance(step, bool):
            attrs[c.WANDB_WB_RUN_STEP] = step
        if run_id:
            attrs[c.WANDB_WB_RUN_ID] = run_id
        if self.config.threads:
            thread = thread_key(attrs)
            turn = self._turns.is_turn(span, attrs)
            if thread is not None:
                attrs[c.WANDB_THREAD_ID] = thread
                if turn:
                    attrs[c.WANDB_IS_TURN] = True
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=self._resource(span.resource),
            attributes=attrs,
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            run_id = self._run_id or current_wandb_run_id()
            batch = [self.enrich(s, run_id) for s in spans]
        except Exception:  # noqa: BLE001 -- a bug of ours must not reach the span processor
            return SpanExportResult.FAILURE
        return self._inner.export(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._inner.shutdown()
