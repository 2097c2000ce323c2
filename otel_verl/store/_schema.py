"""The lake's columns: one row per span, named as the Collector's ClickHouse ``otel_traces``.

A segment row holds the ``otel_traces`` columns (``Timestamp``, ``TraceId``, ``SpanId``,
``ParentSpanId``, ``TraceState``, ``SpanName``, ``SpanKind``, ``ServiceName``,
``ResourceAttributes``, ``ScopeName``, ``ScopeVersion``, ``SpanAttributes``, ``Duration``,
``StatusCode``, ``StatusMessage``, ``Events.Timestamp`` / ``Events.Name`` / ``Events.Attributes``,
``Links.TraceId`` / ``Links.SpanId`` / ``Links.TraceState`` / ``Links.Attributes``) with the
exporter's spellings (``SpanKind`` ``Internal``/``Server``/..., ``StatusCode``
``Unset``/``Ok``/``Error``, attribute maps of strings, ids as hex, ``''`` for no parent), so a
query written here runs on ClickHouse's ``otel_traces`` as long as it sticks to those columns.

Then the RL columns, typed and first-class (lower case, so they never collide with the
exporter's): ``experiment``, ``project``, ``step``, ``sample_index``, ``rollout_n``, ``validate``
(span attribute, else resource, as :meth:`otel_verl.store.Trajectory.attribute`),
``is_trajectory``, ``is_report``, ``is_llm``, ``is_tool``, ``tool_name``, ``tool_error``,
``reward`` (``rollout.reward``, finite), ``reward_components`` (``rollout.reward.<name>``),
``eval_score`` / ``eval_label`` (the first ``gen_ai.evaluation.result`` event), ``turns``,
``tokens_in`` / ``tokens_out``, ``finish_reason``, ``termination``, ``sampling_reason``,
``sampling_weight``, ``policy_version``, ``error_text``, ``report_counts`` (a sampling report's
``rollout.sampling.*`` integers), and where it came from: ``source`` (the store file, relative)
and ``source_offset`` (the byte offset of its line).

Payload content (``input.value``, ``output.value``, GenAI messages, tool arguments and results,
and any attribute value over :data:`PAYLOAD_INLINE_MAX` bytes) is not in ``SpanAttributes``: it
goes to the payload segments (``TraceId``, ``SpanId``, ``Payload`` map), so the span segments stay
narrow.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import orjson
import pyarrow as pa

from otel_verl import semconv
from otel_verl.store import _record
from otel_verl.store._record import SpanRecord

__all__ = ["PAYLOAD_SCHEMA", "SPAN_SCHEMA", "Columns"]

#: attribute values longer than this (in characters) go to the payload segments
PAYLOAD_INLINE_MAX = 1024
POLICY_VERSION = "rollout.policy_version"  # not in semconv yet: read when a writer sets it
REWARD_COMPONENT_PREFIX = semconv.ROLLOUT_REWARD + "."
REPORT_PREFIX = "rollout.sampling."

_STR_MAP = pa.map_(pa.string(), pa.string())
SPAN_SCHEMA = pa.schema([
    ("Timestamp", pa.timestamp("ns")),
    ("TraceId", pa.string()),
    ("SpanId", pa.string()),
    ("ParentSpanId", pa.string()),
    ("TraceState", pa.string()),
    ("SpanName", pa.string()),
    ("SpanKind", pa.string()),
    ("ServiceName", pa.string()),
    ("ResourceAttributes", _STR_MAP),
    ("ScopeName", pa.string()),
    ("ScopeVersion", pa.string()),
    ("SpanAttributes", _STR_MAP),
    ("Duration", pa.int64()),
    ("StatusCode", pa.string()),
    ("StatusMessage", pa.string()),
    ("Events.Timestamp", pa.list_(pa.timestamp("ns"))),
    ("Events.Name", pa.list_(pa.string())),
    ("Events.Attributes", pa.list_(_STR_MAP)),
    ("Links.TraceId", pa.list_(pa.string())),
    ("Links.SpanId", pa.list_(pa.string())),
    ("Links.TraceState", pa.list_(pa.string())),
    ("Links.Attributes", pa.list_(_STR_MAP)),
    # RL columns
    ("experiment", pa.string()),
    ("project", pa.string()),
    ("step", pa.int64()),
    ("sample_index", pa.int64()),
    ("rollout_n", pa.int64()),
    ("validate", pa.bool_()),
    ("is_trajectory", pa.bool_()),
    ("is_report", pa.bool_()),
    ("is_llm", pa.bool_()),
    ("is_tool", pa.bool_()),
    ("tool_name", pa.string()),
    ("tool_error", pa.bool_()),
    ("reward", pa.float64()),
    ("reward_components", pa.map_(pa.string(), pa.float64())),
    ("eval_score", pa.float64()),
    ("eval_label", pa.string()),
    ("turns", pa.int64()),
    ("tokens_in", pa.int64()),
    ("tokens_out", pa.int64()),
    ("finish_reason", pa.string()),
    ("termination", pa.string()),
    ("sampling_reason", pa.string()),
    ("sampling_weight", pa.float64()),
    ("policy_version", pa.int64()),
    ("error_text", pa.string()),
    ("report_counts", pa.map_(pa.string(), pa.int64())),
    ("source", pa.string()),
    ("source_offset", pa.int64()),
])
PAYLOAD_SCHEMA = pa.schema([
    ("TraceId", pa.string()), ("SpanId", pa.string()), ("Payload", _STR_MAP),
    ("experiment", pa.string()), ("step", pa.int64()),
])

_KINDS = {"INTERNAL": "Internal", "SERVER": "Server", "CLIENT": "Client",
          "PRODUCER": "Producer", "CONSUMER": "Consumer", "UNSPECIFIED": "Unspecified"}
_CODES = {"UNSET": "Unset", "OK": "Ok", "ERROR": "Error"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def as_string(value: Any) -> str:
    """An attribute value as the ClickHouse exporter's ``AsString`` writes it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if value is None:
        return ""
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def _str_map(attributes: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, as_string(v)) for k, v in attributes.items()]


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _text(value: Any, limit: int = 1000) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _ns(value: int | None) -> int | None:
    return value if value is not None and 0 <= value <= _INT64_MAX else None


_FLAT_MAPS = ("ResourceAttributes", "SpanAttributes")


class Columns:
    """Span rows gathered column by column, then turned into Arrow tables.

    Strings must be valid Unicode (no lone surrogates): the decoder guarantees it
    (:func:`otel_verl.store._compact.decode_range` scrubs what the stdlib fallback lets in).
    """

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in SPAN_SCHEMA.names
                                           if name not in _FLAT_MAPS}
        # the two big maps, flat: offsets, keys, values
        self.maps: dict[str, tuple[list[int], list[str], list[str]]] = {
            name: ([0], [], []) for name in _FLAT_MAPS}
        self.payload: dict[str, list[Any]] = {name: [] for name in PAYLOAD_SCHEMA.names}

    def __len__(self) -> int:
        return len(self.cols["SpanId"])

    def add(self, span: SpanRecord, source: str, offset: int) -> None:
        """One decoded span (see :class:`otel_verl.store._record.SpanRecord`)."""
        a = span["attributes"]
        r = span["resource"]
        c = self.cols

        def rl(key: str) -> Any:
            value = a.get(key)
            return r.get(key) if value is None else value

        payload: list[tuple[str, str]] = []
        s_off, s_keys, s_values = self.maps["SpanAttributes"]
        for key, value in a.items():
            text = value if isinstance(value, str) else as_string(value)
            if key in _record.PAYLOAD_KEYS or len(text) > PAYLOAD_INLINE_MAX:
                payload.append((key, text))
            else:
                s_keys.append(key)
                s_values.append(text)
        s_off.append(len(s_keys))
        r_off, r_keys, r_values = self.maps["ResourceAttributes"]
        for key, value in r.items():
            r_keys.append(key)
            r_values.append(value if isinstance(value, str) else as_string(value))
        r_off.append(len(r_keys))
        start, end = _ns(span["start_ns"]), _ns(span["end_ns"])
        experiment = rl(semconv.ROLLOUT_EXPERIMENT_NAME)
        step = _int(rl(semconv.ROLLOUT_STEP))
        validate = rl(semconv.ROLLOUT_VALIDATE)
        events = span["events"]
        score, label = _record.evaluation(span) if events or \
            semconv.GEN_AI_EVALUATION_SCORE_LABEL in a else (None, None)
        llm = _record.is_llm_span(span)
        tool = _record.is_tool_span(span)
        finish = a.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
        if isinstance(finish, list):
            finish = finish[0] if finish else None
        report = _record.is_sampling_report(span)
        c["Timestamp"].append(start)
        c["TraceId"].append(span["trace_id"])
        c["SpanId"].append(span["span_id"])
        c["ParentSpanId"].append(span["parent_span_id"] or "")
        c["TraceState"].append("")
        c["SpanName"].append(span["name"])
        c["SpanKind"].append(_KINDS.get(span["kind"]) or str(span["kind"]))
        c["ServiceName"].append(_text(r.get(semconv.SERVICE_NAME)) or "")
        c["ScopeName"].append(span["scope"]["name"])
        c["ScopeVersion"].append(span["scope"]["version"])
        c["Duration"].append(end - start if start is not None and end is not None
                             and end >= start else None)
        code = span["status"]["code"]
        c["StatusCode"].append(_CODES.get(code) or code)
        c["StatusMessage"].append(span["status"]["message"])
        if events:
            c["Events.Timestamp"].append([_ns(e["time_ns"]) for e in events])
            c["Events.Name"].append([e["name"] for e in events])
            c["Events.Attributes"].append([_str_map(e["attributes"]) for e in events])
        else:
            c["Events.Timestamp"].append(_EMPTY)
            c["Events.Name"].append(_EMPTY)
            c["Events.Attributes"].append(_EMPTY)
        links = span["links"]
        if links:
            c["Links.TraceId"].append([lk["trace_id"] or "" for lk in links])
            c["Links.SpanId"].append([lk["span_id"] or "" for lk in links])
            c["Links.TraceState"].append(["" for _ in links])
            c["Links.Attributes"].append([_str_map(lk["attributes"]) for lk in links])
        else:
            c["Links.TraceId"].append(_EMPTY)
            c["Links.SpanId"].append(_EMPTY)
            c["Links.TraceState"].append(_EMPTY)
            c["Links.Attributes"].append(_EMPTY)
        c["experiment"].append(_text(experiment))
        c["project"].append(_text(rl(semconv.ROLLOUT_PROJECT_NAME)))
        c["step"].append(step)
        c["sample_index"].append(_int(rl(semconv.ROLLOUT_SAMPLE_INDEX)))
        c["rollout_n"].append(_int(rl(semconv.ROLLOUT_ROLLOUT_N)))
        c["validate"].append(validate if isinstance(validate, bool) else None)
        c["is_trajectory"].append(_record.is_trajectory_span(span))
        c["is_report"].append(report)
        c["is_llm"].append(llm)
        c["is_tool"].append(tool)
        c["tool_name"].append(_text(a.get(semconv.GEN_AI_TOOL_NAME)) if tool else None)
        c["tool_error"].append(_record.is_tool_error(span) if tool else False)
        c["reward"].append(_finite(a.get(semconv.ROLLOUT_REWARD)))
        components = [(k[len(REWARD_COMPONENT_PREFIX):], f) for k, v in a.items()
                      if k.startswith(REWARD_COMPONENT_PREFIX)
                      and (f := _finite(v)) is not None]
        c["reward_components"].append(components or None)
        c["eval_score"].append(_finite(score))
        c["eval_label"].append(str(label)[:200] if label is not None else None)
        c["turns"].append(_int(a.get(semconv.ROLLOUT_NUM_TURNS)))
        c["tokens_in"].append(_int(a.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)))
        c["tokens_out"].append(_int(a.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)))
        c["finish_reason"].append(_text(finish, 100))
        c["termination"].append(_text(a.get(semconv.ROLLOUT_TERMINATION), 100))
        c["sampling_reason"].append(_text(a.get(semconv.ROLLOUT_SAMPLING_REASON), 200))
        c["sampling_weight"].append(_finite(a.get(semconv.ROLLOUT_SAMPLING_WEIGHT)))
        c["policy_version"].append(_int(a.get(POLICY_VERSION)))
        error = _record.exception_text(span) if events or code == "ERROR" else None
        c["error_text"].append(error[:500] if error else None)
        c["report_counts"].append(
            [(k[len(REPORT_PREFIX):], n) for k, v in a.items()
             if k.startswith(REPORT_PREFIX) and (n := _int(v)) is not None] if report else None)
        c["source"].append(source)
        c["source_offset"].append(offset)
        if payload:
            p = self.payload
            p["TraceId"].append(span["trace_id"])
            p["SpanId"].append(span["span_id"])
            p["Payload"].append(payload)
            p["experiment"].append(_text(experiment))
            p["step"].append(step)

    def table(self) -> pa.Table:
        arrays = []
        for name, column_type in zip(SPAN_SCHEMA.names, SPAN_SCHEMA.types, strict=True):
            if name in self.maps:
                offsets, keys, values = self.maps[name]
                arrays.append(pa.MapArray.from_arrays(
                    pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                    pa.array(values, pa.string())))
            else:
                arrays.append(pa.array(self.cols[name], column_type))
        return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)

    def payload_table(self) -> pa.Table:
        return pa.Table.from_pydict(self.payload, schema=PAYLOAD_SCHEMA)


_EMPTY: list[Any] = []
