"""Compaction's decoder: span rows straight from the parsed OTLP/JSON, in one pass.

:func:`add_resource_spans` walks a line's ``resourceSpans`` as :func:`otel_verl._otlp_json.iter_spans`
does and appends each span's row to a :class:`otel_verl.store._schema.Columns`, the same row
:meth:`Columns.add <otel_verl.store._schema.Columns.add>` builds from the typed
:class:`~otel_verl.store._record.SpanRecord`, without building that record: the attribute map's
strings come from the OTLP ``AnyValue`` members directly, the resource is decoded once per
``resourceSpans`` entry, and only the keys the RL columns read are looked up.

The fast path takes the shapes the OTLP/JSON writers produce (camelCase fields, hex ids,
integer enums, ``stringValue`` / ``intValue`` / ``doubleValue`` / ``boolValue`` members, no
repeated attribute key); a span with events or links, or with anything else (snake_case, base64
ids, a repeated key, a member of the wrong type, a value that fails to decode), goes through the
codec and :meth:`Columns.add` as before, so malformed spans are reported exactly as the codec
reports them. ``tests/unit/test_compact_fast.py`` checks that both give the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_verl._otlp_json import (
    _KINDS,
    _STATUS_CODES,
    DecodeError,
    _dec_attributes,
    _dec_nanos,
    _dec_span,
    _dec_value,
    _enum,
    _get,
)
from otel_verl.store import _schema as S

__all__ = ["add_resource_spans"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1
_PAYLOAD_KEYS = S._record.PAYLOAD_KEYS
_INLINE = S.PAYLOAD_INLINE_MAX
_KIND_TEXT = tuple(S._KINDS.get(k) or k for k in _KINDS)
_CODE_NAMES = _STATUS_CODES
_TEXT_KEYS = S._TEXT_KEYS
_OK_FALSE = '"ok":false'


class _Slow(Exception):
    """This span takes the codec's path."""


def _resource_map(resource: dict[str, Any]) -> tuple[tuple[list[str], list[str]], str]:
    """A resource's map (keys, values; shared by its spans' rows, see
    :attr:`Columns.resources`) and its service name, as :meth:`Columns.add` writes them."""
    values = [v if v.__class__ is str else S.as_string(v) for v in resource.values()]
    return (list(resource), values), S._text(resource.get(S._SERVICE)) or ""


def add_resource_spans(columns: S.Columns, resource_spans: list[Any], source: str, offset: int,
                       on_bad: Callable[[str], None]) -> None:
    """Append the rows of one line's ``resourceSpans`` list (see the module docstring)."""
    for rs in resource_spans:
        try:
            resource = _dec_attributes((rs.get("resource") or {}).get("attributes"))
            scope_spans = _get(rs, "scopeSpans", "scope_spans", None)
            if scope_spans is None:  # OTLP before 0.15 called them instrumentationLibrarySpans
                scope_spans = rs.get("instrumentationLibrarySpans") or []
            if not isinstance(scope_spans, list):
                raise TypeError("scopeSpans is not a list")
        except DecodeError as error:
            on_bad(f"bad resourceSpans entry: {error!r}"[:300])
            continue
        resource_map: tuple[tuple[list[str], list[str]], str] | None = None
        for ss in scope_spans:
            try:
                raw_scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
                scope = {"name": raw_scope.get("name", ""), "version": raw_scope.get("version", "")}
                spans = ss.get("spans") or []
                if not isinstance(spans, list):
                    raise TypeError("spans is not a list")
            except DecodeError as error:
                on_bad(f"bad scopeSpans entry: {error!r}"[:300])
                continue
            for raw in spans:
                if resource_map is None:  # once, where Columns.add would compute it first
                    resource_map = _resource_map(resource)
                r_map, service = resource_map
                try:
                    _fast_row(columns, raw, resource, r_map, service, scope, source, offset)
                    continue
                except Exception:  # noqa: BLE001, S112 - anything unusual: the codec decides
                    pass
                try:
                    span = _dec_span(raw, dict(resource), scope)
                except DecodeError as error:
                    on_bad(f"bad span: {error!r}"[:300])
                    continue
                columns.add(span, source, offset)  # type: ignore[arg-type]


def _fast_row(columns: S.Columns, raw: Any, r: dict[str, Any],
              r_map: tuple[list[str], list[str]], service: str, scope: dict[str, Any],
              source: str, offset: int) -> None:
    """One span's row, or :class:`_Slow` (or any error) before anything is appended."""
    if raw.get("links"):
        raise _Slow
    trace_id = raw["traceId"]
    span_id = raw["spanId"]
    # canonical ids (lowercase hex, not all zeros) are their own hex; anything else: the codec
    if trace_id.__class__ is not str or len(trace_id) != 32 or trace_id.strip(_HEX) \
            or trace_id == _ZERO_TRACE or span_id.__class__ is not str or len(span_id) != 16 \
            or span_id.strip(_HEX) or span_id == _ZERO_SPAN:
        raise _Slow
    parent = raw.get("parentSpanId")
    if parent is None:
        parent = raw.get("parent_span_id")
    if not parent:
        parent = None
    elif parent.__class__ is str and len(parent) == 16 and not parent.strip(_HEX):
        if parent == _ZERO_SPAN:
            parent = None
    else:
        raise _Slow
    name = raw.get("name", "")
    if name.__class__ is not str:
        raise _Slow
    start = raw.get("startTimeUnixNano")
    if start.__class__ is str:
        start = int(start)
        if not 0 <= start <= _UINT64_MAX:
            raise _Slow
    elif start is None:
        start = _dec_nanos(raw.get("start_time_unix_nano"))
    else:
        raise _Slow
    end = raw.get("endTimeUnixNano")
    if end.__class__ is str:
        end = int(end)
        if not 0 <= end <= _UINT64_MAX:
            raise _Slow
    elif end is None:
        end = _dec_nanos(raw.get("end_time_unix_nano"))
    else:
        raise _Slow
    kind = raw.get("kind")
    if kind.__class__ is int and 0 <= kind < 6:
        kind_text = _KIND_TEXT[kind]
    else:
        kind = _enum(kind, _KINDS, "SPAN_KIND_")
        kind_text = _ROW_KINDS.get(kind) or str(kind)
    status = raw.get("status") or _NO_STATUS
    code = status.get("code")
    code = _CODE_NAMES[code] if code.__class__ is int and 0 <= code < 3 else \
        _enum(code, _STATUS_CODES, "STATUS_CODE_")
    message = status.get("message", "")
    if message.__class__ is not str:
        raise _Slow
    raw_events = raw.get("events")

    # attributes: typed values for the RL columns, strings for the map, payload apart
    a: dict[str, Any] = {}
    keys: list[str] = []
    values: list[str] = []
    payload: list[tuple[str, str]] = []
    components: list[tuple[str, float]] | None = None
    n = 0
    text: Any
    for kv in raw.get("attributes") or ():
        key = kv["key"]
        if key.__class__ is not str:
            raise _Slow
        value = kv.get("value")
        n += 1
        if value.__class__ is not dict or len(value) != 1:
            typed = _dec_value(value)
            text = typed if typed.__class__ is str else _as_string(typed)
        elif (text := value.get("stringValue")) is not None:
            if text.__class__ is not str:
                raise _Slow
            typed = text
        elif (typed := value.get("intValue")) is not None:
            if typed.__class__ is str or typed.__class__ is int:
                typed = int(typed)
                if not _INT64_MIN <= typed <= _INT64_MAX:
                    raise _Slow
            else:
                raise _Slow
            text = repr(typed)
        elif (typed := value.get("boolValue")) is not None:
            if typed.__class__ is not bool:
                raise _Slow
            text = "true" if typed else "false"
        else:
            typed = _dec_value(value)
            text = typed if typed.__class__ is str else _as_string(typed)
        a[key] = typed
        if key in _PAYLOAD_KEYS or len(text) > _INLINE:
            payload.append((key, text))
        else:
            keys.append(key)
            values.append(text)
        if key.startswith(_RC_PREFIX):
            f = _finite(typed)
            if f is not None:
                if components is None:
                    components = []
                components.append((key[_RC:], f))
    if len(a) != n:  # a repeated key: the codec's dict keeps the first place, the last value
        raise _Slow

    if raw_events:  # decoded as the codec does; their meaning from _record, as Columns.add
        events: list[Any] = [
            {"name": _str(ev.get("name", "")),
             "time_ns": _dec_nanos(_get(ev, "timeUnixNano", "time_unix_nano")),
             "attributes": _dec_attributes(ev.get("attributes"))} for ev in raw_events]
        record: Any = {"name": name, "attributes": a, "events": events,
                  "status": {"code": code, "message": message}}
        score, label = _evaluation(record)
        error = _exception_text(record)
        ev_times: list[Any] = [_ns(e["time_ns"]) for e in events]
        ev_names: list[Any] = [e["name"] for e in events]
        ev_attrs: list[Any] = [_str_map(e["attributes"]) for e in events]
    else:
        score = None
        label = a.get(_LABEL)
        error = (message or f"{name} failed") if code == "ERROR" else None
        ev_times = ev_names = ev_attrs = _EMPTY
    get = a.get
    experiment = get(_EXPERIMENT)
    if experiment is None:
        experiment = r.get(_EXPERIMENT)
    if experiment is not None:
        experiment = experiment[:1000] if experiment.__class__ is str else _text(experiment)
    project = get(_PROJECT)
    if project is None:
        project = r.get(_PROJECT)
    step = get(_STEP)
    if step is None:
        step = r.get(_STEP)
    step = step if step.__class__ is int and _INT64_MIN <= step <= _INT64_MAX else _int(step)
    sample = get(_SAMPLE)
    if sample is None:
        sample = r.get(_SAMPLE)
    sample = sample if sample.__class__ is int and _INT64_MIN <= sample <= _INT64_MAX \
        else _int(sample)
    rollout_n = get(_ROLLOUT_N)
    if rollout_n is None:
        rollout_n = r.get(_ROLLOUT_N)
    rollout_n = rollout_n if rollout_n.__class__ is int and \
        _INT64_MIN <= rollout_n <= _INT64_MAX else _int(rollout_n)
    validate = get(_VALIDATE)
    if validate is None:
        validate = r.get(_VALIDATE)
    operation = get(_OPERATION)
    span_kind = get(_KIND)
    if operation is not None:
        llm = operation in _LLM_OPERATIONS
        tool = operation == "execute_tool" or span_kind == _TOOL
    else:
        llm = span_kind == _LLM
        tool = span_kind == _TOOL
    if tool:
        if code == "ERROR" or _ERROR_TYPE in a:
            tool_error = True
        else:
            output = get(_OUTPUT_VALUE)
            tool_error = output.__class__ is str and _OK_FALSE in output.replace(" ", "")
    else:
        tool_error = False
    finish = get(_FINISH)
    if isinstance(finish, list):
        finish = finish[0] if finish else None
    report = name == _REPORT and parent is None
    counts: list[tuple[str, int]] | None = None
    if report:
        counts = [(key[_RP:], i) for key, value in a.items() if key.startswith(_RP_PREFIX)
                  and not key.startswith(_RC_PREFIX) and (i := _int(value)) is not None]
    if not _TEXT_KEYS.isdisjoint(a) or _TOOL_NAME in a or span_kind == _TOOL:
        texts = _span_texts({"attributes": a, "name": name})  # type: ignore[typeddict-item]
    else:
        texts = _NO_TEXT
    s_start = start if start is not None and start <= _INT64_MAX else None
    s_end = end if end is not None and end <= _INT64_MAX else None
    row = (
        s_start, trace_id, span_id, parent or "", "", name, kind_text, service,
        scope["name"], scope["version"],
        s_end - s_start if s_start is not None and s_end is not None and s_end >= s_start
        else None,
        _ROW_CODES.get(code) or code, message, ev_times, ev_names, ev_attrs,
        _EMPTY, _EMPTY, _EMPTY, _EMPTY,
        experiment, None if project is None else _text(project), step, sample, rollout_n,
        validate if validate.__class__ is bool else None,
        get(_TRAJECTORY) is True, report, llm, tool,
        _text(get(_TOOL_NAME)) if tool else None, tool_error,
        _finite(get(_REWARD)), components, _finite(score),
        str(label)[:200] if label is not None else None,
        _int(get(_TURNS)), _int(get(_TOKENS_IN)), _int(get(_TOKENS_OUT)),
        _text(finish, 100), _text(get(_TERMINATION), 100),
        _text(get(_SAMPLING_REASON), 200), _finite(get(_SAMPLING_WEIGHT)),
        _int(get(_POLICY_VERSION)), error[:500] if error else None,
        counts, source, offset, *texts,
    )
    # nothing appended before this point: a failure above leaves the columns as they were
    s_off, s_keys, s_values = columns.maps["SpanAttributes"]
    s_keys.extend(keys)
    s_values.extend(values)
    s_off.append(len(s_keys))
    columns.resources.append(r_map)
    columns.rows.append(row)
    if payload:
        p = columns.payload
        p["TraceId"].append(trace_id)
        p["SpanId"].append(span_id)
        p["Payload"].append(payload)
        p["experiment"].append(experiment)
        p["step"].append(step)


def _str(value: Any) -> str:
    if value.__class__ is not str:
        raise _Slow
    return value


_HEX = "0123456789abcdef"
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_NO_STATUS: dict[str, Any] = {}
_NO_TEXT = (None, None, None)
_ROW_KINDS, _ROW_CODES = S._KINDS, S._CODES
_EMPTY = S._EMPTY
_as_string, _str_map, _int, _finite, _text, _ns = (S.as_string, S._str_map, S._int, S._finite,
                                                   S._text, S._ns)
_span_texts = S.span_texts
_evaluation, _exception_text = S._record.evaluation, S._record.exception_text
_RC_PREFIX, _RP_PREFIX, _RC, _RP = S.REWARD_COMPONENT_PREFIX, S.REPORT_PREFIX, S._RC, S._RP
_EXPERIMENT, _PROJECT, _STEP, _SAMPLE = S._EXPERIMENT, S._PROJECT, S._STEP, S._SAMPLE
_ROLLOUT_N, _VALIDATE, _LABEL, _OPERATION = S._ROLLOUT_N, S._VALIDATE, S._LABEL, S._OPERATION
_KIND, _LLM, _TOOL, _LLM_OPERATIONS = S._KIND, S._LLM, S._TOOL, S._LLM_OPERATIONS
_FINISH, _REPORT, _TRAJECTORY, _TOOL_NAME = S._FINISH, S._REPORT, S._TRAJECTORY, S._TOOL_NAME
_REWARD, _TURNS, _TOKENS_IN, _TOKENS_OUT = S._REWARD, S._TURNS, S._TOKENS_IN, S._TOKENS_OUT
_TERMINATION, _SAMPLING_REASON, _SAMPLING_WEIGHT = (S._TERMINATION, S._SAMPLING_REASON,
                                                    S._SAMPLING_WEIGHT)
_POLICY_VERSION = S.POLICY_VERSION
_ERROR_TYPE, _OUTPUT_VALUE = S.semconv.ERROR_TYPE, S.semconv.OUTPUT_VALUE
