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

Last, the viewer's text of a span (:func:`span_texts`, the trajectory model's rule): ``text_prompt``
and ``text_response`` (the user prompt and the answer its payloads show, cut at
:data:`TEXT_MAX` characters) and ``text_tool`` (a tool call as ``name(arguments) -> result``);
the ``trajectories`` rows build their ``prompt``, ``response`` and ``search`` columns from them.

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
from otel_verl.store._filters import clean_text as _clean
from otel_verl.store._record import SpanRecord, prompt_and_response
from otel_verl.store._record import snippet as _snippet

__all__ = ["PAYLOAD_SCHEMA", "SPAN_SCHEMA", "TEXT_MAX", "Columns", "span_texts"]

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
    # the viewer's text (span_texts: otel_verl.store._record.prompt_and_response)
    ("text_prompt", pa.string()),
    ("text_response", pa.string()),
    ("text_tool", pa.string()),
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
#: a span's prompt / answer text is cut at this many characters
TEXT_MAX = 2000
_TEXT_KEYS = frozenset({semconv.INPUT_VALUE, semconv.OUTPUT_VALUE, semconv.GEN_AI_INPUT_MESSAGES,
                        semconv.GEN_AI_OUTPUT_MESSAGES})


def span_texts(span: SpanRecord) -> tuple[str | None, str | None, str | None]:
    """A span's prompt, answer and tool-call text (:func:`otel_verl.store._record.prompt_and_response`
    and :func:`~otel_verl.store._record.snippet`, the rule the SQLite index had: the same cuts),
    valid UTF-8 (a payload's JSON may hold lone surrogates: replaced)."""
    a = span["attributes"]
    prompt = response = tool = None
    if not _TEXT_KEYS.isdisjoint(a):
        found = prompt_and_response(span)  # type: ignore[arg-type]
        if found[0] is not None:
            prompt = _clean(_snippet(found[0], TEXT_MAX))
        if found[1] is not None:
            response = _clean(_snippet(found[1], TEXT_MAX))
    if _TOOL_NAME in a or a.get(_KIND) == _TOOL:
        arguments = a.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS)
        result = a.get(semconv.GEN_AI_TOOL_CALL_RESULT)
        if arguments is None:
            arguments = a.get(semconv.INPUT_VALUE)
        if result is None:
            result = a.get(semconv.OUTPUT_VALUE)
        tool = _clean(_snippet(f"{a.get(_TOOL_NAME, span['name'])}({_snippet(arguments, 300)}) "
                               f"-> {_snippet(result, 300)}", 700))
    return prompt, response, tool


class Columns:
    """Span rows gathered as tuples (one per span), then turned into Arrow tables.

    Strings must be valid Unicode (no lone surrogates): the decoder guarantees it
    (:func:`otel_verl.store._compact.decode_range` scrubs what the stdlib fallback lets in).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        # the span attributes, flat: offsets, keys, values
        self.maps: dict[str, tuple[list[int], list[str], list[str]]] = {
            "SpanAttributes": ([0], [], [])}
        # each row's resource map as (keys, values); the spans of one resource share one pair,
        # turned into Arrow once (table() takes it for each of its rows)
        self.resources: list[tuple[list[str], list[str]]] = []
        self.payload: dict[str, list[Any]] = {name: [] for name in PAYLOAD_SCHEMA.names}
        self._column_cache: dict[str, list[Any]] | None = None
        # rows built as Arrow tables (otel_verl.store._arrowrows), in order with the tuples:
        # the tuples gathered before a table are turned into tables first
        self.tables: list[tuple[pa.Table, pa.Table]] = []
        self._table_rows = 0

    def __len__(self) -> int:
        return len(self.rows) + self._table_rows

    def add_tables(self, spans: pa.Table, payload: pa.Table) -> None:
        """Span rows and their payload rows already in Arrow (after the rows added so far)."""
        if self.rows:
            self.tables.append((self._rows_table(), self._rows_payload_table()))
            self._table_rows += len(self.rows)
            self.rows = []
            self.maps = {"SpanAttributes": ([0], [], [])}
            self.resources = []
            self.payload = {name: [] for name in PAYLOAD_SCHEMA.names}
            self._column_cache = None
        self.tables.append((spans, payload))
        self._table_rows += spans.num_rows

    @property
    def cols(self) -> dict[str, list[Any]]:
        """The tuple rows as columns (the map columns apart, in :attr:`maps`; the rows added as
        tables are not in them)."""
        if self._column_cache is None or len(self._column_cache["SpanId"]) != len(self.rows):
            columns = list(zip(*self.rows, strict=True)) if self.rows else \
                [() for _ in _ROW_NAMES]
            self._column_cache = {name: list(col) for name, col in
                                  zip(_ROW_NAMES, columns, strict=True)}
        return self._column_cache

    def add(self, span: SpanRecord, source: str, offset: int) -> None:
        """One decoded span (see :class:`otel_verl.store._record.SpanRecord`)."""
        a = span["attributes"]
        r = span["resource"]
        payload: list[tuple[str, str]] = []
        components: list[tuple[str, float]] = []
        counts: list[tuple[str, int]] = []
        s_off, s_keys, s_values = self.maps["SpanAttributes"]
        payload_keys = _record.PAYLOAD_KEYS
        for key, value in a.items():
            text = value if value.__class__ is str else as_string(value)
            if key in payload_keys or len(text) > PAYLOAD_INLINE_MAX:
                payload.append((key, text))
            else:
                s_keys.append(key)
                s_values.append(text)
            if key.startswith("rollout.") and key.startswith(_PREFIXES):
                if key.startswith(REWARD_COMPONENT_PREFIX):
                    f = _finite(value)
                    if f is not None:
                        components.append((key[_RC:], f))
                elif (n := _int(value)) is not None:
                    counts.append((key[_RP:], n))
        s_off.append(len(s_keys))
        self.resources.append((list(r), [value if value.__class__ is str else as_string(value)
                                         for value in r.values()]))
        get = a.get
        start, end = _ns(span["start_ns"]), _ns(span["end_ns"])
        experiment = get(_EXPERIMENT)
        if experiment is None:
            experiment = r.get(_EXPERIMENT)
        project = get(_PROJECT)
        if project is None:
            project = r.get(_PROJECT)
        step = get(_STEP)
        step = _int(r.get(_STEP) if step is None else step)
        sample = get(_SAMPLE)
        sample = _int(r.get(_SAMPLE) if sample is None else sample)
        rollout_n = get(_ROLLOUT_N)
        rollout_n = _int(r.get(_ROLLOUT_N) if rollout_n is None else rollout_n)
        validate = get(_VALIDATE)
        if validate is None:
            validate = r.get(_VALIDATE)
        events = span["events"]
        score, label = _record.evaluation(span) if events or _LABEL in a else (None, None)
        operation = get(_OPERATION)
        if operation is not None:
            llm = operation in _LLM_OPERATIONS
            tool = operation == "execute_tool" or get(_KIND) == _TOOL
        else:
            kind = get(_KIND)
            llm = kind == _LLM
            tool = kind == _TOOL
        finish = get(_FINISH)
        if isinstance(finish, list):
            finish = finish[0] if finish else None
        report = span["name"] == _REPORT and span["parent_span_id"] is None
        code = span["status"]["code"]
        error = _record.exception_text(span) if events or code == "ERROR" else None
        links = span["links"]
        self.rows.append((
            start, span["trace_id"], span["span_id"], span["parent_span_id"] or "", "",
            span["name"], _KINDS.get(span["kind"]) or str(span["kind"]),
            _text(r.get(_SERVICE)) or "", span["scope"]["name"], span["scope"]["version"],
            end - start if start is not None and end is not None and end >= start else None,
            _CODES.get(code) or code, span["status"]["message"],
            [_ns(e["time_ns"]) for e in events] if events else _EMPTY,
            [e["name"] for e in events] if events else _EMPTY,
            [_str_map(e["attributes"]) for e in events] if events else _EMPTY,
            [lk["trace_id"] or "" for lk in links] if links else _EMPTY,
            [lk["span_id"] or "" for lk in links] if links else _EMPTY,
            ["" for _ in links] if links else _EMPTY,
            [_str_map(lk["attributes"]) for lk in links] if links else _EMPTY,
            _text(experiment), _text(project), step, sample, rollout_n,
            validate if validate.__class__ is bool else None,
            get(_TRAJECTORY) is True, report, llm, tool,
            _text(get(_TOOL_NAME)) if tool else None,
            _record.is_tool_error(span) if tool else False,
            _finite(get(_REWARD)), components or None, _finite(score),
            str(label)[:200] if label is not None else None,
            _int(get(_TURNS)), _int(get(_TOKENS_IN)), _int(get(_TOKENS_OUT)),
            _text(finish, 100), _text(get(_TERMINATION), 100),
            _text(get(_SAMPLING_REASON), 200), _finite(get(_SAMPLING_WEIGHT)),
            _int(get(POLICY_VERSION)), error[:500] if error else None,
            (counts if report else None), source, offset, *span_texts(span),
        ))
        if payload:
            p = self.payload
            p["TraceId"].append(span["trace_id"])
            p["SpanId"].append(span["span_id"])
            p["Payload"].append(payload)
            p["experiment"].append(_text(experiment))
            p["step"].append(step)

    def table(self) -> pa.Table:
        if not self.tables:
            return self._rows_table()
        parts = [spans for spans, _ in self.tables]
        if self.rows:
            parts.append(self._rows_table())
        return pa.concat_tables(parts)

    def payload_table(self) -> pa.Table:
        if not self.tables:
            return self._rows_payload_table()
        parts = [payload for _, payload in self.tables]
        if self.rows:
            parts.append(self._rows_payload_table())
        return pa.concat_tables(parts)

    def _rows_table(self) -> pa.Table:
        columns = self.cols
        arrays = []
        for name, column_type in zip(SPAN_SCHEMA.names, SPAN_SCHEMA.types, strict=True):
            if name == "SpanAttributes":
                offsets, keys, values = self.maps[name]
                arrays.append(pa.MapArray.from_arrays(
                    pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                    pa.array(values, pa.string())))
            elif name == "ResourceAttributes":
                arrays.append(self._resource_array())
            else:
                arrays.append(pa.array(columns[name], column_type))
        return pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)

    def _resource_array(self) -> pa.Array:
        index: dict[int, int] = {}
        rows: list[int] = []
        offsets, keys, values = [0], [], []
        for pair in self.resources:
            i = index.get(id(pair))
            if i is None:
                i = index[id(pair)] = len(index)
                keys.extend(pair[0])
                values.extend(pair[1])
                offsets.append(len(keys))
            rows.append(i)
        unique = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                         pa.array(values, pa.string()))
        return unique.take(pa.array(rows, pa.int32())) if len(index) != len(rows) else unique

    def _rows_payload_table(self) -> pa.Table:
        return pa.Table.from_pydict(self.payload, schema=PAYLOAD_SCHEMA)


_EMPTY: list[Any] = []
_ROW_NAMES = tuple(n for n in SPAN_SCHEMA.names if n not in _FLAT_MAPS)
_PREFIXES = (REWARD_COMPONENT_PREFIX, REPORT_PREFIX)
_RC, _RP = len(REWARD_COMPONENT_PREFIX), len(REPORT_PREFIX)
_EXPERIMENT = semconv.ROLLOUT_EXPERIMENT_NAME
_PROJECT = semconv.ROLLOUT_PROJECT_NAME
_STEP = semconv.ROLLOUT_STEP
_SAMPLE = semconv.ROLLOUT_SAMPLE_INDEX
_ROLLOUT_N = semconv.ROLLOUT_ROLLOUT_N
_VALIDATE = semconv.ROLLOUT_VALIDATE
_LABEL = semconv.GEN_AI_EVALUATION_SCORE_LABEL
_OPERATION = semconv.GEN_AI_OPERATION_NAME
_KIND = semconv.OPENINFERENCE_SPAN_KIND
_LLM = semconv.SpanKindName.LLM
_TOOL = semconv.SpanKindName.TOOL
_LLM_OPERATIONS = semconv.LLM_OPERATIONS
_FINISH = semconv.GEN_AI_RESPONSE_FINISH_REASONS
_REPORT = semconv.SAMPLING_REPORT_SPAN
_SERVICE = semconv.SERVICE_NAME
_TRAJECTORY = semconv.OTEL_VERL_TRAJECTORY
_TOOL_NAME = semconv.GEN_AI_TOOL_NAME
_REWARD = semconv.ROLLOUT_REWARD
_TURNS = semconv.ROLLOUT_NUM_TURNS
_TOKENS_IN = semconv.GEN_AI_USAGE_INPUT_TOKENS
_TOKENS_OUT = semconv.GEN_AI_USAGE_OUTPUT_TOKENS
_TERMINATION = semconv.ROLLOUT_TERMINATION
_SAMPLING_REASON = semconv.ROLLOUT_SAMPLING_REASON
_SAMPLING_WEIGHT = semconv.ROLLOUT_SAMPLING_WEIGHT
