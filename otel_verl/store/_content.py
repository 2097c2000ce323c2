"""Rebuild every LLM call's whole prompt from the per-turn deltas (the read side of
``otel_verl._content``; the format is in docs/content.md).

Usage::

    index = ContentIndex.load(trace_dir)       # the nodes under <trace_dir>/content/ (.nodes.gz
                                               # gzip members, or older plain .nodes lines)
    index.add_spans(spans)                     # + the deltas spans carry whole (inline)
    index.rebuild("tok:sha256:...")       # the whole token (or message) list
    turn_prompts(spans, index)                 # one record per delta-coded LLM call

A node says ``content(id) = content(base)[:base_len] + delta``. A rebuild follows ``base`` links
back to a node without one, then concatenates forward; a missing node, a cycle or a length that
does not match is reported (``ContentError``), never papered over. Token content is checked
against its id (the hash is recomputed), so a rebuilt prompt is the one that was sent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from otel_verl import _content, _content_store, semconv

__all__ = ["ContentError", "ContentIndex", "resolve_refs", "turn_prompts"]


class ContentError(ValueError):
    """A prompt that cannot be rebuilt exactly (a node missing, damaged or inconsistent)."""


class _Node:
    __slots__ = ("base", "base_len", "delta", "id", "kind", "length")

    def __init__(self, content_id: str, kind: str, length: int, base: str | None,
                 base_len: int, delta: list[Any]) -> None:
        self.id, self.kind, self.length = content_id, kind, length
        self.base, self.base_len, self.delta = base, base_len, delta


def _node_from(record: Mapping[str, Any]) -> _Node | None:
    """A node from a store line or a span's fields; None when it is not a well-formed node."""
    content_id, kind, delta = record.get("id"), record.get("kind"), record.get("delta")
    length, base, base_len = record.get("len"), record.get("base"), record.get("base_len", 0)
    if type(content_id) is not str or kind not in (_content.KIND_TOKENS, _content.KIND_MESSAGES):
        return None
    if type(delta) is not list or type(length) is not int or type(base_len) is not int:
        return None
    if base is not None and (type(base) is not str or base == content_id):
        return None  # (a prompt equal to its base is its base's node, never its own)
    if length != (base_len if base is not None else 0) + len(delta):
        return None
    return _Node(content_id, kind, length, base, base_len, delta)


class ContentIndex:
    """Nodes by id, from content store files and from spans."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        #: lines that were not nodes (a damaged or half-written store line, or a damaged gzip
        #: member: one each)
        self.bad_lines = 0
        self.files: list[str] = []

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ContentIndex:
        """Every node under ``<path>/content/`` (``path``: a trace dir, or a file in one)."""
        index = cls()
        root = os.fspath(path)
        if os.path.isfile(root):
            root = os.path.dirname(root) or "."
        folder = os.path.join(root, _content.CONTENT_DIR)
        if not os.path.isdir(folder):
            return index
        for name in sorted(os.listdir(folder)):
            if name.endswith((_content.NODES_SUFFIX, _content_store.GZIP_SUFFIX)):
                index.read_file(os.path.join(folder, name))
        return index

    def read_file(self, path: str) -> None:
        """Add the nodes of one store file: gzip members (``.gz``) or plain lines (damaged lines
        and members are counted and skipped)."""
        self.files.append(path)
        if not path.endswith(".gz"):
            with open(path, "rb") as stream:
                for line in stream:
                    self._add_line(line)
            return
        with open(path, "rb") as stream:
            data = stream.read()
        for _offset, _size, inflated in _content_store.iter_members(data):
            if inflated is None:
                self.bad_lines += 1
                continue
            for line in inflated.splitlines():
                self._add_line(line)

    def _add_line(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            self.bad_lines += 1
            return
        node = _node_from(record) if isinstance(record, dict) else None
        if node is None:
            self.bad_lines += 1
            return
        self.nodes.setdefault(node.id, node)

    def add_spans(self, spans: Iterable[Mapping[str, Any]]) -> None:
        """Add the nodes that spans carry whole: a delta shown inline (``otel_verl.content.inline``
        true), so a prompt rebuilds even where the store lost a node."""
        for span in spans:
            attrs = span.get("attributes") or {}
            content_id = attrs.get(semconv.CONTENT_ID)
            if type(content_id) is not str or content_id in self.nodes:
                continue
            if attrs.get(semconv.CONTENT_INLINE) is not True:
                continue
            delta = _input_field(attrs, attrs.get(semconv.CONTENT_FIELD))
            node = _node_from({"id": content_id, "kind": attrs.get(semconv.CONTENT_KIND),
                               "len": attrs.get(semconv.CONTENT_LEN),
                               "base": attrs.get(semconv.CONTENT_BASE_ID),
                               "base_len": attrs.get(semconv.CONTENT_BASE_LEN, 0),
                               "delta": delta})
            if node is not None:
                self.nodes[node.id] = node

    def rebuild(self, content_id: str, *, verify: bool = True) -> list[Any]:
        """The whole content of ``content_id``.

        Raises:
            ContentError: a node of its chain is missing or inconsistent, or (``verify``, token
                content) the rebuilt tokens do not hash to ``content_id``.
        """
        chain: list[_Node] = []
        seen: set[str] = set()
        current: str | None = content_id
        while current is not None:
            if current in seen:
                raise ContentError(f"a cycle of base links at {current}")
            seen.add(current)
            node = self.nodes.get(current)
            if node is None:
                raise ContentError(f"content node {current} is missing"
                                   + (f" (the chain of {content_id})"
                                      if current != content_id else ""))
            chain.append(node)
            current = node.base
        items: list[Any] = []
        for node in reversed(chain):
            if node.base is not None:
                if len(items) < node.base_len:
                    raise ContentError(f"node {node.id}: base {node.base} has {len(items)} "
                                       f"items, fewer than base_len {node.base_len}")
                del items[node.base_len:]
            items.extend(node.delta)
            if len(items) != node.length:
                raise ContentError(f"node {node.id}: rebuilt {len(items)} items, not "
                                   f"{node.length}")
        if verify and _content.kind_of(content_id) == _content.KIND_TOKENS:
            if _content.token_content_id(items) != content_id:
                raise ContentError(f"the rebuilt tokens of {content_id} do not hash to it")
        return items


def _input_field(attrs: Mapping[str, Any], field: Any) -> Any:
    """``input.value[field]`` of a span (None when absent or not JSON)."""
    text = attrs.get(semconv.INPUT_VALUE)
    if type(text) is not str or type(field) is not str:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value.get(field) if isinstance(value, dict) else None


def turn_prompts(spans: Iterable[Mapping[str, Any]], index: ContentIndex
                 ) -> list[dict[str, Any]]:
    """One record per LLM call whose prompt was delta-coded, in start order: ``span_id``,
    ``name``, ``field``, ``kind``, ``content_id``, ``length``, ``base_span_id``, and ``prompt``
    (the whole prompt as sent) or ``error`` (why it cannot be rebuilt)."""
    chosen = [s for s in spans
              if type((s.get("attributes") or {}).get(semconv.CONTENT_ID)) is str]
    chosen.sort(key=lambda s: (s.get("start_ns") or 0, s.get("span_id") or ""))
    index.add_spans(chosen)
    out: list[dict[str, Any]] = []
    for span in chosen:
        attrs = span["attributes"]
        record: dict[str, Any] = {
            "span_id": span.get("span_id"), "name": span.get("name"),
            "field": attrs.get(semconv.CONTENT_FIELD), "kind": attrs.get(semconv.CONTENT_KIND),
            "content_id": attrs[semconv.CONTENT_ID], "length": attrs.get(semconv.CONTENT_LEN),
            "base_span_id": attrs.get(semconv.CONTENT_BASE_SPAN_ID),
        }
        try:
            record["prompt"] = index.rebuild(attrs[semconv.CONTENT_ID])
        except ContentError as exc:
            record["error"] = str(exc)
        out.append(record)
    return out


def resolve_refs(value: Any, index: ContentIndex) -> Any:
    """A decoded ``input.value``/``output.value`` with its references into the content store
    (``{"$content": id, "len": n, "delta": [...]}``: the first n items of ``id`` then the delta;
    ``{"$content": id, "start": s, "len": n}``: items s to s+n of ``id``) replaced by the lists
    they stand for; a reference that cannot be resolved raises ``ContentError``."""
    if isinstance(value, dict):
        ref = value.get(_content.REF_KEY)
        if type(ref) is str and type(value.get("len")) is int:
            whole = index.rebuild(ref)
            start = value.get("start")
            if type(start) is int:
                if start + value["len"] > len(whole):
                    raise ContentError(f"reference past the end of {ref}")
                return whole[start:start + value["len"]]
            if value["len"] > len(whole):
                raise ContentError(f"reference past the end of {ref}")
            delta = value.get("delta")
            return whole[:value["len"]] + (delta if isinstance(delta, list) else [])
        return {k: resolve_refs(v, index) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, index) for v in value]
    return value
