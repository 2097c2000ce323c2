"""Calls -> JSON bytes: the per-call size cap (shrink with visible markers) and batch splitting.

A call is encoded once; batches are assembled from the encoded bytes, so splitting a batch under
the request cap never re-serialises anything.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from otel_weave_exporter._translate import RawJSON

#: where the exporter records which fields it cut (a call attribute, filterable in Weave)
TRUNCATED_ATTR = "weave_exporter_truncated"
_SHRINK_FIELDS = ("inputs", "output", "attributes", "exception")
_RAW_FIELDS = ("inputs", "output")
_BATCH_HEAD = b'{"batch":['
_BATCH_TAIL = b"]}"


def _dumps(obj: Any) -> bytes:
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:  # NaN / Infinity: JSON has no such numbers; weave sends null too
        text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"), default=str)
    return text.encode("utf-8", "surrogatepass")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _cut(value: Any, max_str: int, max_items: int) -> Any:
    """``value`` with long strings and long lists cut, each cut marked in place."""
    if isinstance(value, str):
        if len(value) > max_str:
            return value[:max_str] + f"…[truncated {len(value) - max_str} chars]"
        return value
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k): _cut(v, max_str, max_items) for k, v in items[:max_items]}
        if len(items) > max_items:
            out["…"] = f"[truncated {len(items) - max_items} keys]"
        return out
    if isinstance(value, (list, tuple)):
        out_list = [_cut(v, max_str, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            out_list.append(f"…[truncated {len(value) - max_items} items]")
        return out_list
    return value


def _materialise(call: dict[str, Any]) -> dict[str, Any]:
    """The call with its RawJSON payloads parsed (text that is not JSON after all stays text)."""
    out = dict(call)
    for f in _RAW_FIELDS:
        v = out.get(f)
        if isinstance(v, RawJSON):
            try:
                out[f] = json.loads(v.text)
            except ValueError:
                out[f] = v.text
            if f == "inputs" and not isinstance(out[f], dict):
                out[f] = {"input": out[f]}
    return out


def _not_finite(data: bytes) -> bool:
    """True when JSON text may hold NaN / Infinity (not JSON). The one-byte searches are memchr
    fast and rule out most payloads (token ids, numbers) before the slower substring search."""
    return (b"N" in data or b"I" in data) and (b"NaN" in data or b"Infinity" in data)


def _splice(call: dict[str, Any], raws: dict[str, bytes]) -> bytes:
    """Encode the call with its raw JSON payloads inserted as they are (no parse, no re-encode)."""
    head = _dumps({k: v for k, v in call.items() if k not in raws})
    tail = b"".join(b',"' + k.encode() + b'":' + r for k, r in raws.items())
    return head[:-1] + tail + b"}"


def encode_call(call: dict[str, Any], max_bytes: int) -> tuple[bytes, bool]:
    """The call as JSON bytes no larger than ``max_bytes``; True when something was cut.

    Payloads that arrive as :class:`RawJSON` are spliced in as they are, unless they contain
    NaN / Infinity (not JSON; parsed and written as null) or the call is over the cap.

    Oversized calls keep their identity, times and tree position; their biggest fields lose
    string tails / list items (each cut says how much went), the cut fields are listed under
    ``attributes.weave_exporter_truncated``, and a field that still cannot fit is replaced by a
    marker dict with its original size.
    """
    raws = {
        f: v.text.encode("utf-8", "surrogatepass")
        for f in _RAW_FIELDS
        if isinstance(v := call.get(f), RawJSON)
    }
    if raws:
        if any(_not_finite(r) for r in raws.values()):
            call = _materialise(call)
        else:
            data = _splice(call, raws)
            if len(data) <= max_bytes:
                return data, False
            call = _materialise(call)
    data = _dumps(call)
    if len(data) <= max_bytes:
        return data, False
    sizes = {f: len(_dumps(call.get(f))) for f in _SHRINK_FIELDS}
    big = sorted((f for f in _SHRINK_FIELDS if sizes[f] > 256), key=sizes.__getitem__, reverse=True)
    shrunk = dict(call)
    shrunk["attributes"] = dict(call.get("attributes") or {})
    shrunk["attributes"][TRUNCATED_ATTR] = big
    max_str, max_items = max(max_bytes // 4, 64), 1000
    for _ in range(12):
        for f in big:
            shrunk[f] = _cut(call.get(f), max_str, max_items)
        if TRUNCATED_ATTR not in shrunk["attributes"]:  # "attributes" itself was cut
            shrunk["attributes"][TRUNCATED_ATTR] = big
        data = _dumps(shrunk)
        if len(data) <= max_bytes:
            return data, True
        max_str, max_items = max(max_str // 4, 16), max(max_items // 4, 4)
    for f in big:  # last resort: a marker in place of each big field
        marker = {"_truncated": True, "original_bytes": sizes[f]}
        if f == "inputs":
            shrunk[f] = marker
        elif f == "attributes":
            shrunk[f] = {"_truncated": True, "original_bytes": sizes[f], TRUNCATED_ATTR: big}
        elif f == "exception":
            shrunk[f] = json.dumps({"type": "Truncated", "message": f"{sizes[f]} bytes"})
        else:
            shrunk[f] = marker
        data = _dumps(shrunk)
        if len(data) <= max_bytes:
            break
    return data, True


def batch_body(parts: list[bytes]) -> bytes:
    """The calls/complete request body for already-encoded calls."""
    return _BATCH_HEAD + b",".join(parts) + _BATCH_TAIL


def split_batches(parts: Iterable[bytes], max_request_bytes: int) -> Iterator[list[bytes]]:
    """Group encoded calls into request bodies no larger than ``max_request_bytes``.

    A single call larger than the request cap (only possible when the per-call cap is set
    above it) still goes alone; the server decides.
    """
    overhead = len(_BATCH_HEAD) + len(_BATCH_TAIL)
    batch: list[bytes] = []
    size = overhead
    for part in parts:
        add = len(part) + (1 if batch else 0)
        if batch and size + add > max_request_bytes:
            yield batch
            batch, size, add = [], overhead, len(part)
        batch.append(part)
        size += add
    if batch:
        yield batch
