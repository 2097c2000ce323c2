"""Compaction's columnar decoder: a stretch of OTLP/JSON lines parsed by ``pyarrow.json`` with an
explicit schema, and the span rows built with Arrow compute.

:func:`add_stretch` takes the complete lines of one read (``decode_range``'s stretch) and
appends their span table and payload table to a :class:`otel_verl.store._schema.Columns`, the
same rows :func:`otel_verl.store._fastrows.add_resource_spans` builds one span at a time
(``tests/unit/test_compact_fast.py`` compares every column of every row). Python runs only
where the rows need it: the ``repr`` of doubles, the resources and scopes (one per
``resourceSpans`` / ``scopeSpans`` entry), the events, and the viewer's text of the spans with
payloads (:func:`otel_verl.store._schema.span_texts`).

It takes only what the OTLP/JSON writers produce, and proves it before appending anything:

- ``pyarrow.json`` refuses, for the whole stretch, any field the schema does not name
  (snake_case fields, ``arrayValue`` / ``kvlistValue`` / ``bytesValue``, links' contents, an
  ``instrumentationLibrarySpans``), a member of another JSON type (an ``intValue`` as a JSON
  number, a time as a number), a repeated key in one object, a lone surrogate, invalid JSON;
- then the checks here: valid UTF-8 (Arrow does not check it), no byte-order mark, one value
  per line (Arrow would read ``{}{}`` on one line as two), no blank line, no ``"field": null`` (Arrow reads null as absent, the codec does not always),
  canonical lower-case hex ids, decimal times and ``intValue`` strings of
  at most 19 and 18 digits, finite doubles, known kinds and status codes, exactly one
  ``AnyValue`` member, no repeated attribute key in a span, no link.

Anything else returns ``None`` and the stretch goes through the per-line decoder, which reports
damage as before. Nothing is appended unless the whole stretch succeeded.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from otel_verl._otlp_json import _KINDS, _STATUS_CODES, _dec_attributes, _dec_nanos
from otel_verl.store import _schema as S

__all__ = ["SCHEMA", "add_parsed", "add_stretch", "parse_stretch"]

_STR = pa.string()
_I64 = pa.int64()
_F64 = pa.float64()
_VALUE = pa.struct([("stringValue", _STR), ("intValue", _STR), ("doubleValue", _F64),
                    ("boolValue", pa.bool_())])
_KV = pa.list_(pa.struct([("key", _STR), ("value", _VALUE)]))
_EVENT = pa.struct([("timeUnixNano", _STR), ("name", _STR), ("attributes", _KV),
                    ("droppedAttributesCount", _I64)])
_SPAN = pa.struct([
    ("traceId", _STR), ("spanId", _STR), ("parentSpanId", _STR), ("traceState", _STR),
    ("name", _STR), ("kind", _I64), ("startTimeUnixNano", _STR), ("endTimeUnixNano", _STR),
    ("attributes", _KV), ("droppedAttributesCount", _I64), ("events", pa.list_(_EVENT)),
    ("droppedEventsCount", _I64), ("links", pa.list_(pa.null())), ("droppedLinksCount", _I64),
    ("status", pa.struct([("code", _I64), ("message", _STR)])), ("flags", _I64)])
#: the OTLP/JSON line as the writers produce it (ExportTraceServiceRequest)
SCHEMA = pa.schema([("resourceSpans", pa.list_(pa.struct([
    ("resource", pa.struct([("attributes", _KV), ("droppedAttributesCount", _I64)])),
    ("scopeSpans", pa.list_(pa.struct([
        ("scope", pa.struct([("name", _STR), ("version", _STR), ("attributes", _KV),
                             ("droppedAttributesCount", _I64)])),
        ("spans", pa.list_(_SPAN)), ("schemaUrl", _STR)]))),
    ("schemaUrl", _STR)])))])
_PARSE = pj.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="error")
_INT64_MAX = 2**63 - 1
#: the largest block pyarrow.json parses at once (a longer line gets a block of its own size)
_BLOCK_MAX = 64 << 20

_KIND_TEXT = [S._KINDS.get(k) or k for k in _KINDS] + [S._KINDS.get(_KINDS[0]) or _KINDS[0]]
_CODE_TEXT = [S._CODES.get(c) or c for c in _STATUS_CODES] + [S._CODES[_STATUS_CODES[0]]]
_TEXT_NEEDS = (S._TEXT_KEYS | {S._TOOL_NAME, S._KIND, S.semconv.GEN_AI_TOOL_CALL_ARGUMENTS,
                               S.semconv.GEN_AI_TOOL_CALL_RESULT})


class _Refused(Exception):
    """The stretch takes the per-line decoder."""


def _check(ok: Any) -> None:
    """``ok`` (a boolean array or scalar) is true everywhere, or the stretch is refused."""
    if isinstance(ok, pa.Scalar):
        if ok.as_py() is not True:
            raise _Refused
        return
    if ok.null_count or not pc.all(ok, min_count=0).as_py():
        raise _Refused


def _structural_null(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds ``"field": null`` outside a string (an escaped quote before the
    colon means the text is inside a string)."""
    find = data.find
    pos = find(b"null")
    while pos >= 0:
        j = pos - 1
        while j >= 0 and data[j] in b" \t\r\n":
            j -= 1
        if j >= 0 and data[j] == 0x3A:  # ':'
            j -= 1
            while j >= 0 and data[j] in b" \t\r\n":
                j -= 1
            if j >= 0 and data[j] == 0x22:  # '"': escaped by an odd run of backslashes?
                k = j - 1
                while k >= 0 and data[k] == 0x5C:
                    k -= 1
                if (j - 1 - k) % 2 == 0:
                    return True
        pos = find(b"null", pos + 4)
    return False


def _line_starts(data: bytes | bytearray) -> tuple[list[int], int] | None:
    """Each line's offset in ``data`` and the longest line; None when a line is blank."""
    starts = []
    longest = 0
    pos = 0
    find = data.find
    end = len(data)
    while pos < end:
        nl = find(b"\n", pos)
        if nl - pos < 2 and not data[pos:nl].strip():
            return None
        starts.append(pos)
        longest = max(longest, nl - pos)
        pos = nl + 1
    return starts, longest


def _field(array: Any, name: str) -> Any:
    return pc.struct_field(array, name)


def _flat(lists: Any) -> tuple[Any, Any, Any]:
    """``(values, parent index of each value, offsets into values per list)`` (null lists are
    empty); null values are refused."""
    values = pc.list_flatten(lists)
    if values.null_count:
        raise _Refused
    lengths = pc.fill_null(pc.list_value_length(lists), 0).cast(_I64)
    offsets = pa.concat_arrays([pa.array([0], _I64), pc.cumulative_sum(lengths)])
    return values, pc.list_parent_indices(lists), offsets


def _positions(mask: Any, offsets: Any) -> Any:
    """Per list (``offsets``), where its values with ``mask`` start among the masked values:
    the offsets of the filtered lists (length = lists + 1)."""
    counted = pc.cumulative_sum(mask.cast(_I64))
    return pc.take(pa.concat_arrays([pa.array([0], _I64), counted]), offsets)


def _scatter(has: Any, values: Any, n: int) -> Any:
    """A length-``n`` array: ``values`` in order where ``has``, null elsewhere."""
    if len(values) == n:
        return values
    return pc.replace_with_mask(pa.nulls(n, values.type), has, values)


def _map(offsets: Any, keys: Any, items: Any, valid: Any = None) -> Any:
    return pa.MapArray.from_arrays(offsets.cast(pa.int32()), keys, items,
                                   mask=None if valid is None else pc.invert(valid))


def _empty_lists(n: int, value_type: Any) -> Any:
    return pa.ListArray.from_arrays(pc.fill_null(pa.nulls(n + 1, pa.int32()), 0),
                                    pa.array([], value_type))


def _first(members: Any) -> Any:
    """The member that is there (an AnyValue has one)."""
    for value in members:
        if value is not None:
            return value
    return None


def _py_value(kv_value: dict[str, Any] | None) -> dict[str, Any] | None:
    """An AnyValue as orjson would have read it (Arrow fills the absent members with None)."""
    if kv_value is None:
        return None
    return {k: v for k, v in kv_value.items() if v is not None}


def _py_attributes(kvs: list[dict[str, Any]] | None) -> dict[str, Any]:
    if not kvs:
        return {}
    return _dec_attributes([{"key": kv["key"], "value": _py_value(kv["value"])} for kv in kvs])


class _Attribute:
    """One attribute key across the spans: ``[0]`` whether each span has it, ``[1]`` .. ``[4]``
    its ``stringValue`` / ``intValue`` / ``doubleValue`` / ``boolValue`` per span (null where
    absent), each built when first asked for."""

    def __init__(self, rows: Any, kv_span: Any, spans: Any, members: tuple[Any, ...]) -> None:
        n = len(spans)
        self._has = pc.is_in(spans, value_set=pc.take(kv_span, rows))
        self._rows = rows  # the attribute rows with this key, in span order
        self._members = members
        self._n = n
        self._filtered: dict[int, Any] = {}
        self._built: dict[int, Any] = {}

    def values(self, i: int) -> Any:
        """Member ``i`` of the spans that have the attribute (after :meth:`present`)."""
        return self._filtered[i]

    def present(self, i: int) -> bool:
        """Whether any span's value is of member ``i``."""
        if i not in self._filtered:
            self._filtered[i] = self._members[i - 1].take(self._rows)
        filtered = self._filtered[i]
        return bool(filtered.null_count != len(filtered))

    def __getitem__(self, i: int) -> Any:
        if i == 0:
            return self._has
        if i not in self._built:
            member = self._members[i - 1]
            self._built[i] = _scatter(self._has, self._filtered[i], self._n) \
                if self.present(i) else pa.nulls(self._n, member.type)
        return self._built[i]


def add_stretch(columns: S.Columns, data: bytes | bytearray, start: int, source: str
                 ) -> int | None:
    """Append the rows of ``data`` (complete lines, each ending with ``\\n``; ``start`` the
    offset of its first byte in the file) to ``columns``: :func:`parse_stretch`, then
    :func:`add_parsed`.

    Returns:
        The number of lines, or None when the stretch needs the per-line decoder (nothing was
        appended).
    """
    parsed = parse_stretch(data)
    return None if parsed is None else add_parsed(columns, parsed, start, source)


def parse_stretch(data: bytes | bytearray, threads: bool = True
                  ) -> tuple[pa.Table, list[int]] | None:
    """The checks on a stretch of complete lines and its ``pyarrow.json`` parse (what may run
    in another thread: the parse releases the GIL): ``(table, line starts)``, or None when the
    stretch needs the per-line decoder. ``threads``: pyarrow's, for the parse (faster, for
    ~1.3x the CPU; a parse that runs beside other work needs none)."""
    if not data.isascii():  # (10x cheaper than the decode; ASCII holds no BOM either)
        if b"\xef\xbb\xbf" in data:  # a BOM: Arrow skips it, orjson not
            return None
        try:  # pyarrow.json does not check UTF-8; the per-line decoder refuses such a line
            data.decode()
        except UnicodeDecodeError:
            return None
    if _structural_null(data):
        return None
    found = _line_starts(data)
    if found is None:
        return None
    starts, longest = found
    try:
        # one block for a stretch (up to 64 MiB): the rows are built per block, and each
        # build makes a few hundred Arrow calls whatever the block's size (two 16 MiB blocks
        # of a 32 MiB stretch built in 1.2x the time of one)
        block = max(min(len(data) + 1, _BLOCK_MAX), 1 << 20, longest + 2)
        table = pj.read_json(pa.BufferReader(data), parse_options=_PARSE,
                             read_options=pj.ReadOptions(block_size=block, use_threads=threads))
    except (pa.ArrowException, ValueError, UnicodeDecodeError):
        return None
    if table.num_rows != len(starts):
        return None
    return table, starts


def add_parsed(columns: S.Columns, parsed: tuple[pa.Table, list[int]], start: int,
               source: str) -> int | None:
    """Append the rows of a :func:`parse_stretch` result (``start``: the stretch's offset in
    the file) to ``columns``; the number of lines, or None (nothing appended) when a check on
    the rows refused them."""
    table, starts = parsed
    built = []
    first = 0
    try:
        for batch in table.to_batches():  # a block of lines each (no copy into one array)
            built.append(_build(batch.column(0), starts[first:first + batch.num_rows], start,
                                source))
            first += batch.num_rows
    except Exception:  # noqa: BLE001 - _Refused, or anything else Arrow or Python refused here
        return None
    for spans, payload in built:
        columns.add_tables(spans, payload)
    return len(starts)


def _build(lines: pa.Array, starts: list[int], start: int, source: str
           ) -> tuple[pa.Table, pa.Table]:
    """The span and payload tables of ``lines`` (the ``resourceSpans`` of each line)."""
    if lines.null_count:
        raise _Refused  # a line without resourceSpans: the per-line decoder reports it
    rs, rs_line, _ = _flat(lines)
    ss, ss_rs, _ = _flat(_field(rs, "scopeSpans"))
    sp, sp_ss, _ = _flat(_field(ss, "spans"))
    n = len(sp)
    sp_rs = pc.take(ss_rs, sp_ss)
    sp_line = pc.take(rs_line, sp_rs)

    # resources and scopes: few, in Python, as the per-line decoder reads them
    try:
        resources = [_py_attributes((r or {}).get("attributes"))
                     for r in _field(rs, "resource").to_pylist()]
    except Exception as failure:  # noqa: BLE001 - the per-line decoder reports it
        raise _Refused from failure
    scopes = [s or {} for s in _field(ss, "scope").to_pylist()]
    for scope in scopes:
        if scope.get("name") is None:
            scope["name"] = ""
        if scope.get("version") is None:
            scope["version"] = ""

    # ids, times, kind, status
    trace = _field(sp, "traceId")
    span_id = _field(sp, "spanId")
    _check(pc.match_substring_regex(trace, "^[0-9a-f]{32}$"))
    _check(pc.match_substring_regex(span_id, "^[0-9a-f]{16}$"))
    _check(pc.not_equal(trace, "0" * 32))
    _check(pc.not_equal(span_id, "0" * 16))
    parent = _field(sp, "parentSpanId")
    no_parent = pc.or_(pc.is_null(parent), pc.or_(pc.equal(parent, ""),
                                                   pc.equal(parent, "0" * 16)))
    no_parent = pc.fill_null(no_parent, True)
    _check(pc.or_(no_parent, pc.fill_null(pc.match_substring_regex(parent, "^[0-9a-f]{16}$"),
                                          False)))
    parent_text = pc.if_else(no_parent, "", parent)
    name = pc.fill_null(_field(sp, "name"), "")
    times = []
    for field in ("startTimeUnixNano", "endTimeUnixNano"):
        raw = _field(sp, field)
        _check(pc.fill_null(pc.match_substring_regex(raw, "^[0-9]{1,19}$"), True))
        as_uint = raw.cast(pa.uint64())
        _check(pc.fill_null(pc.less_equal(as_uint, pa.scalar(_INT64_MAX, pa.uint64())), True))
        times.append(as_uint.cast(_I64))
    t_start, t_end = times
    duration = pc.if_else(pc.greater_equal(t_end, t_start), pc.subtract(t_end, t_start), None)
    kind = _field(sp, "kind")
    _check(pc.fill_null(pc.and_(pc.greater_equal(kind, 0), pc.less(kind, 6)), True))
    kind_text = pc.take(pa.array(_KIND_TEXT), pc.fill_null(kind, 6))
    status = _field(sp, "status")
    code = _field(status, "code")
    _check(pc.fill_null(pc.and_(pc.greater_equal(code, 0), pc.less(code, 3)), True))
    code = pc.fill_null(code, 0)
    is_error = pc.equal(code, 2)
    message = pc.fill_null(_field(status, "message"), "")
    links = pc.fill_null(pc.list_value_length(_field(sp, "links")), 0)
    _check(pc.equal(links, 0))

    # attributes, flat: one AnyValue member each, no key twice in a span
    kv, kv_span, kv_off = _flat(_field(sp, "attributes"))
    key = _field(kv, "key")
    if key.null_count:
        raise _Refused
    value = _field(kv, "value")
    if value.null_count:
        raise _Refused
    m_str, m_int_raw = _field(value, "stringValue"), _field(value, "intValue")
    m_dbl, m_bool = _field(value, "doubleValue"), _field(value, "boolValue")
    members = pc.add(pc.add(pc.is_valid(m_str).cast(pa.int8()), pc.is_valid(m_int_raw)
                            .cast(pa.int8())),
                     pc.add(pc.is_valid(m_dbl).cast(pa.int8()), pc.is_valid(m_bool)
                            .cast(pa.int8())))
    _check(pc.equal(members, 1))
    _check(pc.fill_null(pc.match_substring_regex(m_int_raw, "^-?[0-9]{1,18}$"), True))
    _check(pc.fill_null(pc.is_finite(m_dbl), True))
    m_int = m_int_raw.cast(_I64)
    encoded = pc.dictionary_encode(key)
    key_index = encoded.indices.cast(_I64)
    dictionary = encoded.dictionary
    # the attribute rows sorted by key, then span (a stable sort): each key's rows are one run,
    # and a key twice in one span is two equal neighbours (a sort, not a hash: 10x cheaper)
    pair = pc.add(pc.multiply(key_index, n), kv_span.cast(_I64))
    by_key = pc.array_sort_indices(pair)
    run_bounds = [0]
    if len(kv):
        pair = pc.take(pair, by_key)
        _check(pc.not_equal(pair.slice(1), pair.slice(0, len(kv) - 1)))
        sorted_keys = pc.take(key_index, by_key)
        runs = pc.indices_nonzero(pc.not_equal(sorted_keys.slice(1),
                                               sorted_keys.slice(0, len(kv) - 1)))
        run_bounds = [0, *(i + 1 for i in runs.to_pylist()), len(kv)]
    key_pos = {k: i for i, k in enumerate(dictionary.to_pylist())}  # its run, in key order
    span_range = pa.array(range(n), _I64)
    dbl_valid = pc.is_valid(m_dbl)
    dbl_text = _scatter(dbl_valid, pa.array(
        [repr(x) for x in m_dbl.filter(dbl_valid).to_pylist()], _STR), len(kv))

    def text(mask: Any) -> Any:
        """The text of the values where ``mask`` (filtered first: the payloads' strings are
        copied once, not into a text of every value first)."""
        strings = m_str.filter(mask)
        if strings.null_count == 0:
            return strings
        return pc.coalesce(strings, m_int.filter(mask).cast(_STR), dbl_text.filter(mask),
                           pc.if_else(m_bool.filter(mask), "true", "false"))

    payload_key = pc.is_in(dictionary, value_set=pa.array(sorted(S._record.PAYLOAD_KEYS)))
    # only a string's text can be longer than the inline limit (an int's or a double's text is
    # at most 24 characters, a boolean's 5)
    is_payload = pc.or_(pc.take(payload_key, key_index), pc.fill_null(
        pc.greater(pc.utf8_length(m_str), S.PAYLOAD_INLINE_MAX), False))
    inline = pc.invert(is_payload)
    span_attrs = _map(_positions(inline, kv_off), key.filter(inline), text(inline))

    lookups: dict[str, _Attribute | None] = {}
    member_arrays = (m_str, m_int, m_dbl, m_bool)

    def lookup(name: str) -> _Attribute | None:
        """The attribute ``name`` per span (None: no span has it)."""
        if name not in lookups:
            index = key_pos.get(name)
            lookups[name] = None if index is None else _Attribute(
                by_key.slice(run_bounds[index], run_bounds[index + 1] - run_bounds[index]),
                kv_span, span_range, member_arrays)
        return lookups[name]

    null_str, null_int = pa.nulls(n, _STR), pa.nulls(n, _I64)
    null_bool, null_dbl = pa.nulls(n, pa.bool_()), pa.nulls(n, _F64)
    false = pc.fill_null(null_bool, False)

    def string(name: str, limit: int | None = 1000) -> Any:
        found = lookup(name)
        if found is None:
            return null_str
        return found[1] if limit is None else pc.utf8_slice_codeunits(found[1], 0, limit)

    def integer(name: str) -> Any:
        found = lookup(name)
        return null_int if found is None else found[2]

    def finite(name: str) -> Any:
        found = lookup(name)
        return null_dbl if found is None else pc.coalesce(found[3], pc.cast(found[2], _F64, safe=False))

    def boolean(name: str) -> Any:
        found = lookup(name)
        return null_bool if found is None else found[4]

    def with_resource(name: str, span_value: Any, convert: Any, column_type: Any) -> Any:
        per_resource = pa.array([convert(r.get(name)) for r in resources], column_type)
        from_resource = pc.take(per_resource, sp_rs)
        found = lookup(name)
        return from_resource if found is None else pc.if_else(found[0], span_value,
                                                              from_resource)

    experiment = with_resource(S._EXPERIMENT, string(S._EXPERIMENT), S._text, _STR)
    project = with_resource(S._PROJECT, string(S._PROJECT), S._text, _STR)
    step = with_resource(S._STEP, integer(S._STEP), S._int, _I64)
    sample = with_resource(S._SAMPLE, integer(S._SAMPLE), S._int, _I64)
    rollout_n = with_resource(S._ROLLOUT_N, integer(S._ROLLOUT_N), S._int, _I64)
    validate = with_resource(S._VALIDATE, boolean(S._VALIDATE),
                             lambda v: v if v.__class__ is bool else None, pa.bool_())
    is_trajectory = pc.fill_null(boolean(S._TRAJECTORY), False)
    operation = lookup(S._OPERATION)
    span_kind = string(S._KIND, None)
    kind_tool = pc.fill_null(pc.equal(span_kind, S._TOOL), False)
    if operation is None:
        llm = pc.fill_null(pc.equal(span_kind, S._LLM), False)
        tool = kind_tool
    else:
        llm = pc.if_else(operation[0], pc.fill_null(pc.is_in(
            operation[1], value_set=pa.array(list(S._LLM_OPERATIONS))), False),
            pc.fill_null(pc.equal(span_kind, S._LLM), False))
        tool = pc.or_(pc.fill_null(pc.equal(operation[1], "execute_tool"), False), kind_tool)
    error_type = lookup(S.semconv.ERROR_TYPE)
    output = lookup(S.semconv.OUTPUT_VALUE)
    ok_false = false
    if output is not None and output.present(1):  # a tool's result only (not every output)
        tool_output = pc.and_(tool, output[0])
        ok_false = _scatter(tool_output, pc.match_substring(pc.replace_substring(
            output.values(1).filter(pc.filter(tool, output[0])), " ", ""), '"ok":false'), n)
    tool_error = pc.and_(tool, pc.or_(pc.or_(is_error, false if error_type is None
                                             else error_type[0]), pc.fill_null(ok_false, False)))
    tool_name = pc.if_else(tool, string(S._TOOL_NAME), null_str)
    report = pc.and_(pc.equal(name, S._REPORT), no_parent)

    # reward components and a report's counts: maps over the matching attributes
    component = pc.and_(pc.starts_with(key, S.REWARD_COMPONENT_PREFIX),
                        pc.or_(pc.is_valid(m_int), dbl_valid))
    c_off = _positions(component, kv_off)
    components = _map(c_off, pc.utf8_slice_codeunits(key.filter(component), S._RC),
                      pc.coalesce(m_dbl, pc.cast(m_int, _F64, safe=False)).filter(component),
                      pc.less(c_off.slice(0, n), c_off.slice(1)))
    counted = pc.and_(pc.and_(pc.starts_with(key, S.REPORT_PREFIX), pc.is_valid(m_int)),
                      pc.invert(pc.starts_with(key, S.REWARD_COMPONENT_PREFIX)))
    counted = pc.and_(counted, pc.take(report, kv_span))
    report_counts = _map(_positions(counted, kv_off),
                         pc.utf8_slice_codeunits(key.filter(counted), S._RP),
                         m_int.filter(counted), report)

    # events, an evaluation label, an error: the few spans with them, in Python
    events = _field(sp, "events")
    ev_count = pc.fill_null(pc.list_value_length(events), 0)
    label = lookup(S._LABEL)
    special = pc.or_(pc.greater(ev_count, 0), is_error)
    if label is not None:
        special = pc.or_(special, label[0])
    special_rows = pc.indices_nonzero(special)
    score_col, label_col, error_col = null_dbl, null_str, null_str
    ev_off = pc.fill_null(pc.cast(pa.concat_arrays([pa.array([0], _I64), pc.cumulative_sum(
        ev_count.cast(_I64))]), pa.int32()), 0)
    ev_times: list[Any] = []
    ev_names: list[Any] = []
    ev_attrs: list[Any] = []
    if len(special_rows):
        s_events = pc.take(events, special_rows).to_pylist()
        s_names = pc.take(name, special_rows).to_pylist()
        s_codes = pc.take(code, special_rows).to_pylist()
        s_messages = pc.take(message, special_rows).to_pylist()
        s_labels = [None] * len(special_rows) if label is None else [
            _first(members) for members in zip(
                *(pc.take(label[i], special_rows).to_pylist() for i in range(1, 5)),
                strict=True)]
        scores, labels, errors = [], [], []
        try:
            for raw_events, span_name, span_code, span_message, span_label in zip(
                    s_events, s_names, s_codes, s_messages, s_labels, strict=True):
                decoded: list[Any] = [{"name": ev["name"] if ev["name"] is not None else "",
                            "time_ns": _dec_nanos(ev["timeUnixNano"]),
                            "attributes": _py_attributes(ev["attributes"])}
                           for ev in raw_events or ()]
                for ev in decoded:
                    ev_times.append(S._ns(ev["time_ns"]))
                    ev_names.append(ev["name"])
                    ev_attrs.append(S._str_map(ev["attributes"]))
                code_name = _STATUS_CODES[span_code]
                record: Any = {"name": span_name, "events": decoded,
                               "attributes": {} if span_label is None else
                               {S._LABEL: span_label},
                               "status": {"code": code_name, "message": span_message}}
                if decoded:
                    score, found_label = S._record.evaluation(record)
                    error = S._record.exception_text(record)
                else:
                    score, found_label = None, span_label
                    error = (span_message or f"{span_name} failed") \
                        if code_name == "ERROR" else None
                scores.append(S._finite(score))
                labels.append(str(found_label)[:200] if found_label is not None else None)
                errors.append(error[:500] if error else None)
        except Exception as failure:  # noqa: BLE001 - the per-line decoder reports it
            raise _Refused from failure
        score_col = _scatter(special, pa.array(scores, _F64), n)
        label_col = _scatter(special, pa.array(labels, _STR), n)
        error_col = _scatter(special, pa.array(errors, _STR), n)
    ev_ts = pa.ListArray.from_arrays(ev_off, pa.array(ev_times, pa.timestamp("ns")))
    ev_nm = pa.ListArray.from_arrays(ev_off, pa.array(ev_names, _STR))
    ev_at = pa.ListArray.from_arrays(ev_off, pa.array(ev_attrs, S._STR_MAP))

    # the viewer's text: span_texts over the attributes it reads
    need = kind_tool
    for text_key in (*S._TEXT_KEYS, S._TOOL_NAME):
        found = lookup(text_key)
        if found is not None:
            need = pc.or_(need, found[0])
    need_rows = pc.indices_nonzero(need)
    texts: list[Any] = [null_str, null_str, null_str]
    if len(need_rows):
        per_key = []
        for text_key in _TEXT_NEEDS:
            found = lookup(text_key)
            if found is None:
                continue
            has = pc.take(found[0], need_rows).to_pylist()
            kept = [pc.take(found[i], need_rows).to_pylist() for i in range(1, 5)
                    if found.present(i)]
            values = kept[0] if len(kept) == 1 else [_first(v) for v in zip(*kept, strict=True)]
            per_key.append((text_key, has, values))
        names = pc.take(name, need_rows).to_pylist()
        out: list[list[Any]] = [[], [], []]
        span_texts = S.span_texts
        for row, span_name in enumerate(names):
            attributes = {k: values[row] for k, has, values in per_key if has[row]}
            for column, got in zip(out, span_texts(
                    {"attributes": attributes, "name": span_name}),  # type: ignore[typeddict-item]
                    strict=True):
                column.append(got)
        texts = [_scatter(need, pa.array(column, _STR), n) for column in out]

    # resources and scopes, per span
    r_maps = [(list(r), [v if v.__class__ is str else S.as_string(v) for v in r.values()])
              for r in resources]
    r_off = [0]
    r_keys: list[str] = []
    r_values: list[str] = []
    for keys, values in r_maps:
        r_keys.extend(keys)
        r_values.extend(values)
        r_off.append(len(r_keys))
    resource_maps = pa.MapArray.from_arrays(pa.array(r_off, pa.int32()), pa.array(r_keys, _STR),
                                            pa.array(r_values, _STR)).take(sp_rs)
    service = pc.take(pa.array([S._text(r.get(S._SERVICE)) or "" for r in resources], _STR),
                      sp_rs)
    scope_name = pc.take(pa.array([s["name"] for s in scopes], _STR), sp_ss)
    scope_version = pc.take(pa.array([s["version"] for s in scopes], _STR), sp_ss)
    offsets = pc.take(pa.array([start + s for s in starts], _I64), sp_line)

    empty_str = _empty_lists(n, _STR)
    columns = {
        "Timestamp": t_start.cast(pa.timestamp("ns")), "TraceId": trace, "SpanId": span_id,
        "ParentSpanId": parent_text, "TraceState": pc.fill_null(null_str, ""),
        "SpanName": name, "SpanKind": kind_text, "ServiceName": service,
        "ResourceAttributes": resource_maps, "ScopeName": scope_name,
        "ScopeVersion": scope_version, "SpanAttributes": span_attrs, "Duration": duration,
        "StatusCode": pc.take(pa.array(_CODE_TEXT), code), "StatusMessage": message,
        "Events.Timestamp": ev_ts, "Events.Name": ev_nm, "Events.Attributes": ev_at,
        "Links.TraceId": empty_str, "Links.SpanId": empty_str, "Links.TraceState": empty_str,
        "Links.Attributes": _empty_lists(n, S._STR_MAP),
        "experiment": experiment, "project": project, "step": step, "sample_index": sample,
        "rollout_n": rollout_n, "validate": validate, "is_trajectory": is_trajectory,
        "is_report": report, "is_llm": llm, "is_tool": tool, "tool_name": tool_name,
        "tool_error": tool_error, "reward": finite(S._REWARD), "reward_components": components,
        "eval_score": score_col, "eval_label": label_col, "turns": integer(S._TURNS),
        "tokens_in": integer(S._TOKENS_IN), "tokens_out": integer(S._TOKENS_OUT),
        "finish_reason": string(S._FINISH, 100), "termination": string(S._TERMINATION, 100),
        "sampling_reason": string(S._SAMPLING_REASON, 200),
        "sampling_weight": finite(S._SAMPLING_WEIGHT),
        "policy_version": integer(S.POLICY_VERSION), "error_text": error_col,
        "report_counts": report_counts, "source": pc.fill_null(null_str, source),
        "source_offset": offsets, "text_prompt": texts[0], "text_response": texts[1],
        "text_tool": texts[2],
    }
    spans = pa.Table.from_arrays([columns[c] for c in S.SPAN_SCHEMA.names], schema=S.SPAN_SCHEMA)

    p_off = _positions(is_payload, kv_off)
    starts_arr = p_off.slice(0, n)
    has_payload = pc.less(starts_arr, p_off.slice(1))
    p_rows = pc.indices_nonzero(has_payload)
    payload_keys = key.filter(is_payload)
    p_offsets = pa.concat_arrays([pc.take(starts_arr, p_rows),
                                  pa.array([len(payload_keys)], _I64)])
    payload = pa.Table.from_arrays([
        pc.take(trace, p_rows), pc.take(span_id, p_rows),
        _map(p_offsets, payload_keys, text(is_payload)),
        pc.take(experiment, p_rows), pc.take(step, p_rows)], schema=S.PAYLOAD_SCHEMA)
    return spans, payload
