"""Large shared content as Weave objects, referenced from the calls (Weave's own dedup by digest).

A Weave object is a value stored once per ``(name, digest)``; a call refers to it with its ref
URI ``weave:///entity/project/object/NAME:DIGEST`` anywhere in its inputs (the server records
it in the call's ``input_refs``; the UI shows it as a link and opens the value). This module
turns content segments into such objects:

* the digest is Weave's own (``weave/shared/digest.py``: SHA-256 of the value's
  ``json.dumps(val, sort_keys=True)``, URL-safe base64 with ``-``/``_`` as ``X``/``Y``, no
  padding), computed here, so a call can name its objects before the server answers; the
  request carries it as ``expected_digest`` and the server checks it;
* the name comes from the content (``otel_verl_content-<content id>``), so the GRPO group's
  ``n`` rollouts, every later step and every process of a run that see the same content publish
  the same ``(name, digest)``: the server keeps one row (``obj_create`` dedups on it), and this
  process sends it once (``published`` remembers what the server accepted, bounded);
* values never hold refs themselves: a nested ref's digest would depend on the hosted server's
  internal project id, which a client cannot know without asking.

Not thread-safe: the exporter calls it under its lock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_weave_exporter import _conventions as c

OBJ_CREATE_PATH = "/obj/create"
OBJECT_PREFIX = "otel_verl_content-"
_MAX_NAME = 128


def weave_digest(val: Any) -> str:
    """Weave's object digest of a plain JSON value (what ``obj_create`` computes server-side)."""
    text = json.dumps(val, sort_keys=True)
    raw = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(raw).decode().replace("-", "X").replace("_", "Y").rstrip("=")


def object_name(content_id: str) -> str:
    """A valid Weave object name (``[\\w._-]``, <= 128 chars) for a content id."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in str(content_id))
    return (OBJECT_PREFIX + safe)[:_MAX_NAME]


@dataclass(frozen=True)
class PendingObject:
    name: str
    digest: str
    body: bytes  # the /obj/create request body


class ContentObjects:
    """Builds object refs and the ``/obj/create`` bodies still to send.

    Args:
        entity, project: the Weave project the refs point into.
        max_pending_bytes: bound of the bodies waiting to be sent; beyond it ``ref`` answers None
            (the caller keeps the content inline instead: nothing is lost).
        max_published: how many accepted ``(name, digest)`` pairs are remembered (oldest
            forgotten first; a forgotten one is simply sent again, the server dedups).
    """

    def __init__(self, entity: str, project: str, *, max_pending_bytes: int = 64 << 20,
                 max_published: int = 65536) -> None:
        self.entity = entity
        self.project = project
        self.project_id = f"{entity}/{project}"
        self.max_pending_bytes = max_pending_bytes
        self.max_published = max_published
        self._pending: OrderedDict[tuple[str, str], PendingObject] = OrderedDict()
        self._pending_bytes = 0
        self._published: OrderedDict[tuple[str, str], None] = OrderedDict()

    def uri(self, name: str, digest: str) -> str:
        return f"weave:///{self.entity}/{self.project}/object/{name}:{digest}"

    def ref(self, content_id: str, val: Any) -> str | None:
        """The ref URI of ``val`` as object ``otel_verl_content-<content_id>``, queued for
        publishing unless already published or queued; None when the queue is full."""
        name = object_name(content_id)
        digest = weave_digest(val)
        key = (name, digest)
        if key in self._published:
            self._published.move_to_end(key)
            return self.uri(name, digest)
        if key not in self._pending:
            body = json.dumps(
                {"obj": {"project_id": self.project_id, "object_id": name, "val": val,
                         "expected_digest": digest}},
                separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
            if self._pending_bytes + len(body) > self.max_pending_bytes:
                return None
            self._pending[key] = PendingObject(name, digest, body)
            self._pending_bytes += len(body)
        return self.uri(name, digest)

    def pending(self) -> list[PendingObject]:
        """The objects still to send, oldest first (they stay queued until ``done``)."""
        return list(self._pending.values())

    def done(self, obj: PendingObject) -> None:
        """The server accepted ``obj``: remember it, drop it from the queue."""
        key = (obj.name, obj.digest)
        if self._pending.pop(key, None) is not None:
            self._pending_bytes -= len(obj.body)
        self._published[key] = None
        if len(self._published) > self.max_published:
            self._published.popitem(last=False)

    def drop(self, obj: PendingObject) -> None:
        """The server refused ``obj`` as invalid: never retried."""
        if self._pending.pop((obj.name, obj.digest), None) is not None:
            self._pending_bytes -= len(obj.body)


@dataclass
class Published:
    sent: int = 0  # objects the server accepted in this round
    requests: int = 0
    retries: int = 0
    rejected: int = 0  # refused as invalid (never retried)
    error: str = ""  # why the round stopped early (the rest stays queued), or ""


def publish(objects: ContentObjects, sender: Any, deadline: float) -> Published:
    """POST every queued object to ``/obj/create`` (one request each, in order) before
    ``deadline``; stops at the first failure that may pass (the rest stays queued, retried by the
    next export). Never raises on HTTP errors."""
    out = Published()
    for obj in objects.pending():
        result = sender.send(OBJ_CREATE_PATH, obj.body, deadline)
        out.retries += result.attempts - (1 if result.ok else 0)
        if result.ok:
            out.requests += 1
            out.sent += 1
            objects.done(obj)
            continue
        if result.rejected or result.too_large:
            out.rejected += 1
            objects.drop(obj)
            out.error = out.error or result.error
            continue
        out.error = result.error or "object not delivered"
        break
    return out


# --- the content store (read side, for deltas beyond a span's cap) ------------------------------


class NodeReader:
    """The nodes of otel_verl's content store (``<trace_dir>/content/*.nodes.gz``, one gzip
    member per node, or plain ``*.nodes``; one JSON node a line: ``{"id", "kind", "len",
    "base", "base_len", "delta"}``), indexed by id as the files grow (only whole lines and
    members; each file read once, from where the last look stopped).

    ``flush`` (optional) is called before looking again for an id not found: otel_verl's
    ``_content.flush_all``, so nodes its writer thread still buffers reach the file first.
    """

    def __init__(self, directory: str, flush: Callable[[], Any] | None = None,
                 max_index: int = 1_000_000) -> None:
        self.directory = directory
        self._flush = flush
        self._offsets: dict[str, int] = {}
        self._index: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self._max_index = max_index

    def _scan(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.directory)
                           if n.endswith((".nodes", ".jsonl", ".nodes.gz")))
        except OSError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            if name.endswith(".gz"):
                self._scan_members(path, start, data)
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next look
            pos = 0
            while pos < end:
                nl = data.index(b"\n", pos)
                head = data[pos:min(nl, pos + 200)]
                marker = head.find(b'"id":"')
                if marker >= 0:
                    close = head.find(b'"', marker + 6)
                    if close > 0:
                        node_id = head[marker + 6:close].decode("utf-8", "replace")
                        self._index[node_id] = (path, start + pos, nl - pos)
                        if len(self._index) > self._max_index:
                            self._index.popitem(last=False)
                pos = nl + 1
            self._offsets[path] = start + end

    def _scan_members(self, path: str, start: int, data: bytes) -> None:
        """Index a ``.nodes.gz`` file (one gzip member per node, otel_verl's
        ``_content_store.iter_members``) from ``start``: a member cut short waits for the next
        look; damaged bytes are skipped (the next member is found by its magic and CRC)."""
        pos = 0
        while pos < len(data):
            size, line = _gzip_member(data, pos)
            if size < 0:  # cut short (a write in progress) or damaged: the next whole one
                nxt = _next_member(data, pos)
                if nxt < 0:
                    break
                pos = nxt
                continue
            marker = line.find(b'"id":"', 0, 200)
            close = line.find(b'"', marker + 6, 300) if marker >= 0 else -1
            if close > 0:
                self._index[line[marker + 6:close].decode("utf-8", "replace")] = (
                    path, start + pos, size)
                if len(self._index) > self._max_index:
                    self._index.popitem(last=False)
            pos += size
        self._offsets[path] = start + pos

    def node(self, node_id: str) -> dict[str, Any] | None:
        """The node ``node_id`` as stored, or None (not in the store, or unreadable)."""
        where = self._index.get(node_id)
        if where is None:
            self._scan()
            where = self._index.get(node_id)
        if where is None and self._flush is not None:
            try:
                self._flush()
            except Exception:  # otel_verl's own problem: the node is just not found
                pass
            self._scan()
            where = self._index.get(node_id)
        if where is None:
            return None
        path, offset, size = where
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                raw = f.read(size)
            if path.endswith(".gz"):  # the node's own gzip member
                raw = zlib.decompress(raw, wbits=31)
            node = json.loads(raw)
        except (OSError, ValueError, zlib.error):
            return None
        return node if isinstance(node, dict) and node.get("id") == node_id else None


_GZIP_MAGIC = b"\x1f\x8b\x08"


def _gzip_member(data: bytes, pos: int) -> tuple[int, bytes]:
    """(size, inflated) of the whole gzip member at ``pos`` (CRC checked), or (-1, b"")."""
    if not data.startswith(_GZIP_MAGIC, pos):
        return -1, b""
    inflater = zlib.decompressobj(wbits=31)
    view = memoryview(data)
    parts: list[bytes] = []
    at = pos
    try:
        while not inflater.eof and at < len(data):
            chunk = view[at:at + 65536]
            parts.append(inflater.decompress(chunk))
            at += len(chunk)
    except zlib.error:
        return -1, b""
    if not inflater.eof:
        return -1, b""
    return at - len(inflater.unused_data) - pos, b"".join(parts)


def _next_member(data: bytes, pos: int) -> int:
    """The offset of the next whole member after ``pos``, or -1 (none yet)."""
    nxt = pos
    while True:
        nxt = data.find(_GZIP_MAGIC, nxt + 1)
        if nxt < 0 or _gzip_member(data, nxt)[0] >= 0:
            return nxt


# --- calls: the delta-coded input field as segments of objects ----------------------------------

#: one piece of a prompt: (the ref URI of its object, its length in items)
Segment = tuple[str, int]


def _take(segments: tuple[Segment, ...], n: int) -> list[Any]:
    """The first ``n`` items of ``segments`` as call segments (a cut one as ``{ref, len}``)."""
    out: list[Any] = []
    left = n
    for uri, length in segments:
        if left <= 0:
            break
        out.append(uri if length <= left else {"ref": uri, "len": left})
        left -= length
    return out


def _slice(segments: tuple[Segment, ...], start: int, n: int) -> list[Any]:
    """Items ``start`` to ``start + n`` of ``segments`` as call segments (a whole object as its
    ref, a part of one as ``{"ref", "start", "len"}``, ``start`` left out when 0)."""
    out: list[Any] = []
    pos = 0
    end = start + n
    for uri, length in segments:
        lo, hi = max(start, pos), min(end, pos + length)
        if lo < hi:
            if lo == pos and hi == pos + length:
                out.append(uri)
            else:
                part: dict[str, Any] = {"ref": uri, "len": hi - lo}
                if lo > pos:
                    part["start"] = lo - pos
                out.append(part)
        pos += length
        if pos >= end:
            break
    return out


def _prefix(segments: tuple[Segment, ...], n: int) -> tuple[Segment, ...] | None:
    """``segments`` cut to their first ``n`` items, as whole segments only (None when a segment
    would be cut: such a prefix is not remembered, only shown)."""
    out: list[Segment] = []
    total = 0
    for uri, length in segments:
        if total >= n:
            break
        if total + length > n:
            return None
        out.append((uri, length))
        total += length
    return tuple(out) if total == n else None


class ContentCalls:
    """Rewrites the delta-coded input field of otel_verl's LLM calls for Weave.

    Each node of a trajectory's chain (a call's prompt; the prompt plus its response) is known
    here either by its items, while its JSON is at most ``inline_max_bytes`` (then a call shows
    its whole prompt inline, as verl's own Weave backend does), or by its segments: objects of
    what each node appended (one per node, named by its content id, so the nodes a GRPO group or
    a later step share are one object). A call with a large prompt shows its field as::

        {"content_id": ..., "length": N, "segments": [REF, REF, ..., <delta inline or REF>],
         "extends": {"content_id": BASE, "length": n, "span_id": ...}}

    the whole prompt being the concatenation of the segments' items (a ``{"ref", "len"}`` is the
    head of an object). A call whose base is unknown here (not seen by this exporter and not in
    the content store) says ``"complete": false`` and keeps its delta and its reference.
    """

    def __init__(self, objects: ContentObjects, reader: NodeReader | None = None, *,
                 inline_max_bytes: int = 2048, max_nodes: int = 20_000) -> None:
        self.objects = objects
        self.reader = reader
        self.inline_max_bytes = inline_max_bytes
        #: node id -> its items (a small node) or its segments (a large one)
        self._nodes: OrderedDict[str, list[Any] | tuple[Segment, ...]] = OrderedDict()
        self._max_nodes = max_nodes
        #: ``incomplete``: calls whose whole prompt could not be referenced (base or delta not
        #: found); ``objects_*``: the ``/obj/create`` requests (``publish_pending``)
        self.stats = {"calls_rewritten": 0, "incomplete": 0, "refs_resolved": 0,
                      "refs_unresolved": 0, "objects_sent": 0,
                      "objects_rejected": 0, "object_requests": 0, "object_retries": 0,
                      "object_rounds_failed": 0}

    # -- nodes ------------------------------------------------------------------------------------
    def _remember(self, node_id: str, entry: list[Any] | tuple[Segment, ...]) -> None:
        self._nodes[node_id] = entry
        self._nodes.move_to_end(node_id)
        if len(self._nodes) > self._max_nodes:
            self._nodes.popitem(last=False)

    def _small(self, items: list[Any]) -> bool:
        return len(json.dumps(items, separators=(",", ":"))) <= self.inline_max_bytes

    def _object(self, name: str, kind: str, items: list[Any]) -> str | None:
        return self.objects.ref(name, {"content_id": name, "kind": kind, "items": items})

    def _entry(self, node_id: str) -> list[Any] | tuple[Segment, ...] | None:
        """A node's items or segments: remembered, else rebuilt from the content store by
        following its base links back to a node known here or a node without a base (a loop or
        a missing node: None)."""
        known = self._nodes.get(node_id)
        if known is not None:
            self._nodes.move_to_end(node_id)
            return known
        if self.reader is None:
            return None
        chain: list[dict[str, Any]] = []
        seen: set[str] = set()
        current = node_id
        start: list[Any] | tuple[Segment, ...] | None = None
        while True:
            if current in seen:
                return None
            seen.add(current)
            node = self.reader.node(current)
            if node is None or not isinstance(node.get("delta"), list):
                return None
            chain.append(node)
            base = node.get("base")
            if not base:
                break
            start = self._nodes.get(str(base))
            if start is not None:
                break
            current = str(base)
        entry = start
        for node in reversed(chain):
            base = node.get("base")
            entry = self._extend_with(str(node["id"]), str(node.get("kind") or ""),
                                      str(base) if base else None, entry if base else None,
                                      _int(node.get("base_len")), node["delta"])
            if entry is None:
                return None
            self._remember(str(node["id"]), entry)
        return entry

    def _extend(self, node_id: str, kind: str, base_id: str | None, base_len: int,
                delta: list[Any]) -> list[Any] | tuple[Segment, ...] | None:
        """The entry of ``content(base_id)[:base_len] + delta`` (None: the base is unknown)."""
        base = self._entry(base_id) if base_id is not None else None
        if base_id is not None and base is None:
            return None
        return self._extend_with(node_id, kind, base_id, base, base_len, delta)

    def _extend_with(self, node_id: str, kind: str, base_id: str | None,
                     base: list[Any] | tuple[Segment, ...] | None, base_len: int,
                     delta: list[Any]) -> list[Any] | tuple[Segment, ...] | None:
        head: list[Any] | tuple[Segment, ...] | None = []
        if base_id is not None and base is not None:
            head = self._head(base_id, kind, base, base_len)
        if head is None:
            return None
        if isinstance(head, list) and self._small(head + delta):
            return head + delta
        segments = self._as_segments(base_id or node_id, kind, head)
        own = self._object(node_id, kind, delta)
        if segments is None or own is None:
            return None
        return (*segments, (own, len(delta)))

    def _head(self, base_id: str, kind: str, base: list[Any] | tuple[Segment, ...],
              n: int) -> list[Any] | tuple[Segment, ...] | None:
        if isinstance(base, list):
            return base[:n] if n <= len(base) else None
        return _prefix(base, n)

    def _as_segments(self, name: str, kind: str, entry: list[Any] | tuple[Segment, ...]
                     ) -> tuple[Segment, ...] | None:
        """Segments for an entry: a small node's items become one object (named after it)."""
        if not isinstance(entry, list):
            return entry
        if not entry:
            return ()
        uri = self._object(f"{name}_{len(entry)}", kind, entry)
        return ((uri, len(entry)),) if uri is not None else None

    # -- calls ------------------------------------------------------------------------------------
    def rewrite(self, inputs: dict[str, Any], output: Any, attrs: Mapping[str, Any]) -> bool:
        """Rewrite ``inputs[field]`` in place; False when the call's prompt is not complete."""
        field = attrs.get(c.CONTENT_FIELD)
        node_id = attrs.get(c.CONTENT_ID)
        if not isinstance(field, str) or not isinstance(node_id, str):
            return True
        kind = str(attrs.get(c.CONTENT_KIND) or "")
        length = _int(attrs.get(c.CONTENT_LEN))
        base_id = attrs.get(c.CONTENT_BASE_ID)
        base_len = _int(attrs.get(c.CONTENT_BASE_LEN))
        delta = inputs.get(field)
        inline = attrs.get(c.CONTENT_INLINE, True) is not False
        delta_len = _int(attrs.get(c.CONTENT_DELTA_LEN), -1)
        if delta_len == 0:
            delta = []  # appends nothing: the call's prompt is its base's node
        elif not (inline and isinstance(delta, list) and len(delta) == delta_len):
            node = self.reader.node(node_id) if self.reader is not None else None
            # the store's node must be this call's step (same base), not another one's
            same = node is not None and (node.get("base") or None) == (base_id or None) and \
                _int(node.get("base_len")) == base_len
            delta = node.get("delta") if node is not None and same else None
        entry = None
        if isinstance(delta, list) and base_len + len(delta) == length:
            entry = self._nodes.get(node_id) or self._extend(
                node_id, kind, str(base_id) if base_id else None, base_len, delta)
        if entry is None:
            self.stats["incomplete"] += 1
            view: dict[str, Any] = {"content_id": node_id, "length": length, "complete": False,
                                    "delta": inputs.get(field)}
            if base_id:
                view["extends"] = {"content_id": base_id, "length": base_len,
                                   "span_id": attrs.get(c.CONTENT_BASE_SPAN_ID)}
            inputs[field] = view
            return False
        assert isinstance(delta, list)
        self.stats["calls_rewritten"] += 1
        self._remember(node_id, entry)
        if isinstance(entry, list):
            inputs[field] = entry  # small: the whole prompt, as the engine received it
        else:
            if delta:  # the entry's last segment is this call's own delta
                segments: list[Any] = _take(entry[:-1], base_len)
                segments.append(delta if self._small(delta) else entry[-1][0])
            else:  # appends nothing: the prompt is its base's node
                segments = _take(entry, length)
            view = {"content_id": node_id, "length": length, "segments": segments}
            if base_id:
                view["extends"] = {"content_id": base_id, "length": base_len,
                                   "span_id": attrs.get(c.CONTENT_BASE_SPAN_ID)}
            inputs[field] = view
        self._response(node_id, entry, output, attrs, kind)
        return True

    def resolve(self, value: Any) -> Any:
        """A payload with otel_verl's references into the content store (``$content``) put back:
        as the list itself while small, else as segments of objects::

            {"content_id": ID, "start": s, "length": N, "segments": [...]}

        (the items ``s`` to ``s + n`` of the node, then the reference's ``delta`` if any). A
        reference whose node is unknown here and not in the store stays as it is (counted,
        ``refs_unresolved``)."""
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        ref = value.get(c.CONTENT_REF_KEY)
        if not (isinstance(ref, str) and isinstance(value.get("len"), int)):
            return {k: self.resolve(v) for k, v in value.items()}
        entry = self._entry(ref)
        raw_start, raw_delta = value.get("start"), value.get("delta")
        start: int = raw_start if isinstance(raw_start, int) else 0
        n = int(value["len"])
        delta: list[Any] = raw_delta if isinstance(raw_delta, list) else []
        total = len(entry) if isinstance(entry, list) else sum(k for _, k in entry or ())
        if entry is None or start < 0 or n < 0 or start + n > total:
            self.stats["refs_unresolved"] += 1
            return value
        self.stats["refs_resolved"] += 1
        if isinstance(entry, list) and self._small(entry[start:start + n] + delta):
            return entry[start:start + n] + delta
        kind = "messages" if ref.startswith("msg:") else "tokens"
        segments = self._as_segments(ref, kind, entry)
        if segments is None:
            self.stats["refs_unresolved"] += 1
            return value
        shown = _slice(segments, start, n)
        if delta:
            own = delta if self._small(delta) else self._object(
                f"{ref}+{n}_{weave_digest(delta)[:16]}", kind, delta)
            if own is None:
                self.stats["refs_unresolved"] += 1
                return value
            shown.append(own)
        return {"content_id": ref, "start": start, "length": n + len(delta), "segments": shown}

    def _response(self, node_id: str, prompt: list[Any] | tuple[Segment, ...], output: Any,
                  attrs: Mapping[str, Any], kind: str) -> None:
        """The prompt + response node (the next call's base), when the output shows it."""
        out_id = attrs.get(c.CONTENT_OUTPUT_ID)
        if not isinstance(out_id, str) or out_id in self._nodes:
            return
        response = _response_items(output, kind)
        length = len(prompt) if isinstance(prompt, list) else sum(n for _, n in prompt)
        if response is None or length + len(response) != _int(attrs.get(c.CONTENT_OUTPUT_LEN)):
            return  # _entry reads it from the content store when the next call needs it
        entry = self._extend(out_id, kind, node_id, length, response)
        if entry is not None:
            self._remember(out_id, entry)


def _response_items(output: Any, kind: str) -> list[Any] | None:
    if not isinstance(output, dict):
        return None
    keys = ("token_ids", "response_ids") if kind == "tokens" else ("messages",)
    for key in keys:
        value = output.get(key)
        if isinstance(value, list):
            return value
    return None


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


# --- the exporter's side ------------------------------------------------------------------------


def content_calls(entity: str, project: str, enabled: bool, content_dir: str | None,
                  flush: Callable[[], Any] | None, inline_max_bytes: int = 2048
                  ) -> ContentCalls | None:
    """The exporter's ``ContentCalls`` (None when ``content_objects`` is off)."""
    if not enabled:
        return None
    reader = NodeReader(content_dir, flush) if content_dir else None
    return ContentCalls(ContentObjects(entity, project), reader, inline_max_bytes=inline_max_bytes)


def publish_pending(content: ContentCalls | None, sender: Any, timeout_s: float) -> None:
    """Send the objects the last translations queued, before their calls go out (under the
    exporter's lock). What fails stays queued for the next export; counted in ``stats``."""
    if content is None or not content.objects.pending():
        return
    import time

    done = publish(content.objects, sender, time.monotonic() + timeout_s)
    st = content.stats
    st["objects_sent"] += done.sent
    st["objects_rejected"] += done.rejected
    st["object_requests"] += done.requests
    st["object_retries"] += done.retries
    if done.error and not done.rejected:
        st["object_rounds_failed"] += 1
