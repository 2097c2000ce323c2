"""The content store (write side): unique content nodes written once per process and run.

The format of a node line is in ``otel_verl._content``'s docstring and ``docs/content.md``; the
reader is ``otel_verl.store._content``. ``otel_verl._content`` re-exports what is public here.

A store file is ``<trace_dir>/content/<pid>-<start ns>.nodes.gz``: one gzip member per node,
each holding the node's JSON line, so ``zcat content/*.nodes.gz`` prints the lines as a plain
``.nodes`` file holds them (the format before compression, still read). One member per node: a
reader reaches a node by its member's offset without inflating the file (the Weave exporter), a
damaged member costs that node only (the next member is found by its magic bytes and checked by
its CRC), and a write cut short (SIGKILL) leaves a truncated last member, counted and skipped.
Decimal token ids compress ~2.4x at level 1 (a real vocabulary's ids, Zipf-distributed; the
rollout stub's repeated filler ~30x), at ~100 MB/s on the store's thread, with the GIL released.
``content_store_bytes`` bounds the content before compression (it is reserved on the caller's
thread, where nothing is compressed).

Tail sampling (``tail_keep``): a provisional trajectory's nodes are *held* in memory until its
tail decision, as its spans are (``hold`` when it starts, ``release`` when it is decided, both
called by ``otel_verl.exporters._tail``): kept (or exported early), they are written; dropped,
they are discarded and their budget given back (``content_discarded``), so the store grows with
the kept trajectories, not with every one recorded. Dedup knows held from written: a node held
for a provisional trajectory that another trajectory also puts is held for both (written when
either is kept, discarded when both are dropped), and a trajectory that is not held (head
sampled, or outside tail sampling) writes a held node at once, so a kept trajectory is always
complete whoever stored a node first. Held nodes are bounded (``HELD_MAX_BYTES``: past it the
oldest are written before their decision, ``content_held_spilled``: bytes, never a loss); a
SIGKILL loses held nodes together with the held spans that refer to them; a store closed with
nodes still held (a decision never came) writes them.

The ids written are remembered for dedup in a bounded LRU (``SEEN_MAX_IDS``): an id that falls
out is written again if it comes back (``content_seen_evicted``; duplicate bytes, never a loss).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

from otel_verl import _fork
from otel_verl._content import (
    CONTENT_DIR,
    KIND_MESSAGES,
    KIND_TOKENS,
    NODES_SUFFIX,
    Step,
    _dumps_sorted,
)
from otel_verl._current import TRAJECTORY

_orjson_loads: Any = None
try:  # the fast decoder (a core dependency)
    import orjson

    _orjson_loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    pass

_log = logging.getLogger("otel_verl")

#: the store's thread writes every this many seconds, or at once past ``WAKE_BYTES`` queued (a
#: thread switch per LLM call would take the GIL from the rollout's loop mid-turn)
WRITE_EVERY_S = 0.2
WAKE_BYTES = 4 * 1024 * 1024
#: a store file written now (gzip members); ``NODES_SUFFIX`` alone: plain lines (older stores)
GZIP_SUFFIX = NODES_SUFFIX + ".gz"
#: zlib level of a node's member: 1 is ~6x faster than the default 6 for ~15 % more bytes
COMPRESS_LEVEL = 1
#: a gzip member starts with these (magic, deflate)
_GZIP_MAGIC = b"\x1f\x8b\x08"
#: bytes fed to the inflater at a time when looking for a member's end (bounds the copy of
#: ``unused_data`` per member: a file of many members is read in linear time)
_READ_CHUNK = 1 << 16


# --- the content store (write side) ------------------------------------------------------------


def messages_of(data: bytes) -> list[Any]:
    """The messages whose hashed bytes are ``data`` (``message_bytes``: one compact JSON text
    per message, each followed by a newline, which compact JSON never holds otherwise): what a
    messages node is written from, so the node holds exactly what its id was computed over, as
    it was when the call was made (the caller's dicts may have changed since)."""
    lines = data.split(b"\n")[:-1]
    try:
        return [_orjson_loads(line) for line in lines] if _orjson_loads is not None else \
            [json.loads(line) for line in lines]
    except ValueError:  # (the json fallback's lone surrogates: not UTF-8, as they were hashed)
        return [json.loads(line.decode("utf-8", "surrogatepass")) for line in lines]


def node_line(kind: str, step: Step, scrubbed_delta: Any = None) -> bytes:
    """One store line for a node (the format of the module docstring)."""
    return _line(kind, step.id, step.length, step.base_id, step.base_len, step.delta_bytes,
                 step.delta if scrubbed_delta is None else scrubbed_delta)


def _line(kind: str, content_id: str, length: int, base_id: str | None, base_len: int,
          delta_bytes: bytes, delta: Any) -> bytes:
    return b"".join(_line_parts(kind, content_id, length, base_id, base_len, delta_bytes, delta))


def _line_parts(kind: str, content_id: str, length: int, base_id: str | None, base_len: int,
                delta_bytes: bytes, delta: Any) -> tuple[bytes | memoryview, ...]:
    """The pieces of ``_line`` in order; a token node's delta is a view of ``delta_bytes`` (at
    a long context: a context-long buffer that is not copied to build the line)."""
    head = {"id": content_id, "kind": kind, "len": length, "base": base_id,
            "base_len": base_len}
    text = _dumps_sorted(head)[:-1]
    if kind == KIND_TOKENS:
        return text + b',"delta":[', memoryview(delta_bytes)[:-1], b"]}\n"
    return text + b',"delta":', _dumps_sorted(delta), b"}\n"


def _member(parts: tuple[bytes | memoryview, ...]) -> bytes:
    """One gzip member of the bytes of ``parts`` joined, compressed piece by piece: the line is
    never built whole (each ``compress`` runs without the GIL; the copies that building a
    128k-token node's line made held it for ~1 ms on the store's thread, while the rollout's
    loop waited for it in the turn-1 burst)."""
    packer = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
    out = [packer.compress(part) for part in parts]
    out.append(packer.flush())
    return b"".join(out)


def _member_at(view: memoryview, pos: int) -> tuple[int, bytes] | None:
    """``(end, inflated)`` of a whole gzip member at ``pos`` (its CRC checked), or None."""
    inflater = zlib.decompressobj(wbits=31)
    parts: list[bytes] = []
    at, end = pos, len(view)
    try:
        while not inflater.eof and at < end:
            chunk = view[at:at + _READ_CHUNK]
            parts.append(inflater.decompress(chunk))
            at += len(chunk)
    except zlib.error:
        return None
    if not inflater.eof:
        return None
    return at - len(inflater.unused_data), b"".join(parts)


def iter_members(data: bytes, start: int = 0) -> Iterator[tuple[int, int, bytes | None]]:
    """The gzip members of a store file's bytes from ``start``: ``(offset, size, inflated)``.

    ``inflated`` is None for damaged bytes, which end where the next whole member starts (found
    by its magic bytes and checked whole, CRC included, so a false start does not pass). Bytes
    with no whole member after them (a write in progress or killed, or damage at the end) are
    ``(offset, -1, None)``, last: a live reader waits for the rest, a reader of a closed store
    counts them."""
    view = memoryview(data)
    pos, end = start, len(data)
    while pos < end:
        whole = _member_at(view, pos) if data.startswith(_GZIP_MAGIC, pos) else None
        if whole is not None:
            yield pos, whole[0] - pos, whole[1]
            pos = whole[0]
            continue
        nxt = pos
        while True:
            nxt = data.find(_GZIP_MAGIC, nxt + 1)
            if nxt < 0:
                yield pos, -1, None
                return
            if _member_at(view, nxt) is not None:
                break
        yield pos, nxt - pos, None
        pos = nxt


#: items per queued node in ``ContentStore._queue`` (kept flat: see ``ContentStore.put``)
_NODE_ITEMS = 7
#: ids remembered as written, for dedup (an LRU: ~170 B each, so ~11 MB at most); one that
#: falls out is written again if it comes back (duplicate bytes, never a loss)
SEEN_MAX_IDS = 1 << 16
#: nodes held for provisional trajectories (tail sampling), in bytes: past it the oldest are
#: written before their trajectory's decision (bytes, never a loss)
HELD_MAX_BYTES = 64 * 1024 * 1024
#: provisional trajectories whose content waits, at most (the oldest past it is released as
#: kept: a decision that never comes costs bytes, never memory without bound)
HOLDING_MAX = 1 << 16
#: ``put``'s default owner: the current trajectory, when it is held (``hold``)
CURRENT: Any = object()


#: a held node: (its ``_NODE_ITEMS`` items, its size, the root span ids of the provisional
#: trajectories that put it); tuples of atoms only (token nodes), so the cyclic GC stops
#: tracking them after their first young collection (a set or an object per node would stay)
_Held = tuple[tuple[Any, ...], int, tuple[int, ...]]


#: provisional trajectories (root span ids) whose nodes are held, oldest first
_HOLDING: collections.OrderedDict[int, None] = collections.OrderedDict()
_HOLDING_LOCK = threading.Lock()


def hold(owner: int) -> None:
    """A provisional trajectory started: its nodes wait for ``release`` (tail sampling)."""
    with _HOLDING_LOCK:
        _HOLDING[owner] = None
        evicted = _HOLDING.popitem(last=False)[0] if len(_HOLDING) > HOLDING_MAX else None
    if evicted is not None:
        _release_in_stores(evicted, True)


def release(owner: int, keep: bool) -> None:
    """A provisional trajectory was decided: its held nodes are written (``keep``) or discarded
    (unless another held trajectory still needs them); its later nodes are written at once."""
    with _HOLDING_LOCK:
        if owner not in _HOLDING:  # never held, or released already
            return
        del _HOLDING[owner]
    _release_in_stores(owner, keep)


def _release_in_stores(owner: int, keep: bool) -> None:
    # after ``_HOLDING`` lost it: a put that saw it held (under its store's lock) is done
    for store in list(_STORES.values()):
        store.release(owner, keep)


def _current_owner() -> int | None:
    """The current trajectory's root span id when its nodes are held, else None."""
    traj = TRAJECTORY.get()
    if traj is None or not traj.provisional or traj.span is None:
        return None
    owner: int = traj.span.get_span_context().span_id
    return owner if owner in _HOLDING else None


class _Owned:
    """A store bound to the trajectory current when it was made (a put on another thread)."""

    __slots__ = ("owner", "store")

    def __init__(self, store: ContentStore, owner: int | None) -> None:
        self.store = store
        self.owner = owner

    def put(self, kind: str, step: Step) -> str:
        return self.store.put(kind, step, self.owner)


class ContentStore:
    """The content store of one process and run: nodes deduplicated by id, written by one
    background thread, bounded by ``max_bytes`` (over it: counted, said once, never silent)."""

    def __init__(self, directory: str, max_bytes: int, redact: bool,
                 max_ids: int = SEEN_MAX_IDS, held_max_bytes: int = HELD_MAX_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.redact = redact
        #: ids written (or queued), least recently put first; at most ``max_ids``
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._max_ids = max_ids
        #: nodes held for provisional trajectories (oldest first), and by whom
        self._held: dict[str, _Held] = {}
        self._held_by: dict[int, list[str]] = {}
        self._held_bytes = 0
        self._held_max = held_max_bytes
        self._reserved = 0
        self._lock = threading.Lock()
        #: nodes waiting for the store's thread, and their bytes: ``_NODE_ITEMS`` flat items per
        #: node (kind, id, len, base, base_len, delta bytes, delta or None), no tuple or Step
        #: kept per node: a container per LLM call that lives until the next write feeds the
        #: young GC, which scans every 32k-token list in flight (a token node keeps only bytes)
        self._queue: collections.deque[Any] = collections.deque()
        self._queued_bytes = 0
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._thread: threading.Thread | None = None
        self._file: Any = None
        self._pid = os.getpid()
        self.path = os.path.join(directory, f"{self._pid}-{time.time_ns()}{GZIP_SUFFIX}")
        self.counts = {"content_nodes": 0, "content_bytes": 0, "content_dedup_hits": 0,
                       "content_dropped": 0, "content_dropped_bytes": 0, "content_errors": 0,
                       "content_redacted": 0, "content_discarded": 0,
                       "content_discarded_bytes": 0, "content_held_spilled": 0,
                       "content_seen_evicted": 0}
        self._warned = False
        #: set when ``close_all`` or a fork drops this store: callers holding it take a new one
        self.retired = False

    def put(self, kind: str, step: Step, owner: Any = CURRENT) -> str:
        """Store a node once: ``"stored"`` (now or before), or ``"missing"`` (over budget).

        A step that appends nothing is its base (same content, same id): nothing to write.
        ``owner``: the provisional trajectory it is held for (default: the current one, when
        ``hold`` was called for it; None: written at once)."""
        if owner is CURRENT:
            owner = _current_owner() if _HOLDING else None
        size = len(step.delta_bytes) + 160
        content_id = step.id
        with self._lock:
            if content_id in self._seen:
                self._seen.move_to_end(content_id)
                self.counts["content_dedup_hits"] += 1
                return "stored"
            if owner is not None and owner not in _HOLDING:  # decided since: written at once
                owner = None
            held = self._held.get(content_id)
            if held is not None:
                self.counts["content_dedup_hits"] += 1
                if owner is None:  # wanted by a trajectory that is not held: written now
                    self._promote(content_id)
                elif owner not in held[2]:
                    self._held[content_id] = (held[0], held[1], (*held[2], owner))
                    self._held_by.setdefault(owner, []).append(content_id)
                return "stored"
            if content_id == step.base_id:  # its base is not here: refused over budget (or
                # written and forgotten by the LRU, when nothing was ever refused)
                return "missing" if self.counts["content_dropped"] else "stored"
            if self._reserved + size > self.max_bytes:
                self.counts["content_dropped"] += 1
                self.counts["content_dropped_bytes"] += size
                warn, self._warned = not self._warned, True
            else:
                warn = False
                self._reserved += size
                items = (kind, content_id, step.length, step.base_id, step.base_len,
                         step.delta_bytes, None)  # (a messages node: from its bytes)
                if owner is None:
                    self._enqueue(items, size)
                else:
                    self._held[content_id] = (items, size, (owner,))
                    self._held_by.setdefault(owner, []).append(content_id)
                    self._held_bytes += size
                    while self._held_bytes > self._held_max and self._held:
                        self.counts["content_held_spilled"] += 1
                        self._promote(next(iter(self._held)))
                return "stored"
        if warn:
            _log.warning("otel_verl: the content store is full (content_store_bytes=%d): content "
                         "beyond it is not stored (counted as content_dropped); spans say "
                         "otel_verl.content.stored=missing", self.max_bytes)
        return "missing"

    def bound(self) -> ContentStore | _Owned:
        """This store for a put that happens later on another thread (a prompt hashed off the
        loop) on behalf of the current trajectory."""
        owner = _current_owner() if _HOLDING else None
        return self if owner is None else _Owned(self, owner)

    def _enqueue(self, items: tuple[Any, ...], size: int) -> None:
        """A node to the store's thread (under the lock), its id remembered as written."""
        seen = self._seen
        seen[items[1]] = None
        if len(seen) > self._max_ids:
            seen.popitem(last=False)
            self.counts["content_seen_evicted"] += 1
        self._pending += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel_verl-content",
                                            daemon=True)
            self._thread.start()
        self._queue.extend(items)
        self._queued_bytes += size
        if self._queued_bytes >= WAKE_BYTES:  # else the thread comes by on its own:
            self._wake.notify()  # no thread switch per call on the rollout's loop

    def _promote(self, content_id: str) -> None:
        """A held node is written (under the lock)."""
        items, size, _owners = self._held.pop(content_id)
        self._held_bytes -= size
        self._enqueue(items, size)

    def release(self, owner: int, keep: bool) -> None:
        """``owner``'s held nodes: written (``keep``), or discarded where no other held
        trajectory needs them (their budget given back). Kept: the store's thread is woken
        (once per kept trajectory, not per call): its nodes, queued as its spans are handed to
        the batch processor, reach the file first as a rule (a SIGKILL between the two costs
        content the spans refer to: the rebuild says "missing", never a wrong prompt)."""
        with self._lock:
            promoted = False
            for content_id in self._held_by.pop(owner, ()):
                held = self._held.get(content_id)
                if held is None:  # written already (spilled, or wanted by another)
                    continue
                if keep:
                    self._promote(content_id)
                    promoted = True
                    continue
                owners = tuple(o for o in held[2] if o != owner)
                if owners:  # another held trajectory needs it still
                    self._held[content_id] = (held[0], held[1], owners)
                    continue
                del self._held[content_id]
                size = held[1]
                self._held_bytes -= size
                self._reserved -= size
                self.counts["content_discarded"] += 1
                self.counts["content_discarded_bytes"] += size
            if promoted:
                self._wake.notify()

    def held(self) -> tuple[int, int]:
        """(nodes, bytes) held for provisional trajectories now."""
        with self._lock:
            return len(self._held), self._held_bytes

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._closing:
                    self._wake.wait(WRITE_EVERY_S)
                if not self._queue:
                    if self._closing:
                        return
                    continue
                batch = list(self._queue)
                self._queue.clear()
                self._queued_bytes = 0
            count = len(batch) // _NODE_ITEMS
            for at in range(0, len(batch), _NODE_ITEMS):
                try:
                    self._write(*batch[at:at + _NODE_ITEMS])
                except Exception as exc:  # noqa: BLE001 - disk full, a bad item: counted, said
                    with self._lock:
                        self.counts["content_errors"] += 1
                    _log.warning("otel_verl: content store write failed: %r", exc)
            if self._file is not None:  # each batch reaches the OS: a SIGKILL loses at most one
                try:
                    self._file.flush()
                except (OSError, ValueError) as exc:
                    with self._lock:
                        self.counts["content_errors"] += 1
                    _log.warning("otel_verl: content store write failed: %r", exc)
            with self._idle:
                self._pending -= count
                if self._pending == 0:
                    self._idle.notify_all()

    def _write(self, kind: str, content_id: str, length: int, base_id: str | None,
               base_len: int, delta_bytes: bytes, delta: Any) -> None:
        if kind == KIND_MESSAGES and delta is None:
            delta = messages_of(delta_bytes)
        if kind == KIND_MESSAGES and self.redact:
            delta, hits = _scrub_value(delta)
            if hits:
                with self._lock:
                    self.counts["content_redacted"] += hits
        member = _member(_line_parts(kind, content_id, length, base_id, base_len, delta_bytes,
                                     delta))
        if self._file is None:
            os.makedirs(self.directory, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - held open, closed in close()
        self._file.write(member)
        with self._lock:
            self.counts["content_nodes"] += 1
            self.counts["content_bytes"] += len(member)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every node put so far is written and flushed to the OS."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            self._wake.notify()
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        if self._file is not None:
            try:
                self._file.flush()
            except (OSError, ValueError):
                return False
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:  # a decision that never came: written (bytes, never a loss)
            for content_id in list(self._held):
                self._promote(content_id)
            self._held_by.clear()
        self.flush(timeout_s)
        if self._thread is not None:
            with self._lock:
                self._closing = True
                self._wake.notify()
            self._thread.join(timeout_s)
            with self._lock:
                self._thread = None
                self._closing = False  # a later put starts a thread again
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def _scrub_value(value: Any) -> tuple[Any, int]:
    """Every string inside ``value`` through the span scrubber (one pass per string)."""
    from otel_verl.exporters._scrub import scrub

    hits = [0]
    return _scrub_walk(value, scrub, hits), hits[0]


def _scrub_walk(item: Any, scrub: Any, hits: list[int]) -> Any:
    # (a module function, not a closure: a recursive closure is a reference cycle per call,
    # garbage that only the cyclic GC frees, and each collection scans the tokens in flight)
    if type(item) is str:
        text, found = scrub(item)
        hits[0] += found
        return text
    if isinstance(item, Mapping):
        return {k: _scrub_walk(v, scrub, hits) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return [_scrub_walk(v, scrub, hits) for v in item]
    return item


_STORES: dict[tuple[str, int, bool], ContentStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(trace_dir: str, max_bytes: int, redact: bool) -> ContentStore:
    """The process's content store for a trace dir (one per process and run)."""
    key = (os.path.abspath(trace_dir), max_bytes, redact)
    store = _STORES.get(key)
    if store is not None:
        return store
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = ContentStore(os.path.join(key[0], CONTENT_DIR), max_bytes,
                                                redact)
        return store


def flush_all(timeout_s: float = 10.0) -> bool:
    """Flush every content store of this process (``RolloutTraceConfig.flush`` calls it)."""
    return all([store.flush(timeout_s) for store in list(_STORES.values())])


def close_all(timeout_s: float = 5.0) -> dict[str, int]:
    """Write out and close every content store (the next put opens a new file: a new run);
    returns their counters, summed."""
    with _STORES_LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
    total: dict[str, int] = {}
    for store in stores:
        store.retired = True
        store.close(timeout_s)
        for key, value in store.stats().items():
            total[key] = total.get(key, 0) + value
    return total


def stats_all() -> dict[str, int]:
    """The counters of every content store of this process, summed."""
    total: dict[str, int] = {}
    for store in list(_STORES.values()):
        for key, value in store.stats().items():
            total[key] = total.get(key, 0) + value
    return total


def _after_fork_in_child() -> None:
    global _HOLDING_LOCK
    for store in _STORES.values():
        store.retired = True
    _STORES.clear()  # the parent's threads and files are not the child's
    _HOLDING.clear()  # the parent's trajectories are decided there
    _HOLDING_LOCK = threading.Lock()


_fork.register_after_in_child(_after_fork_in_child, "content store")
atexit.register(close_all)
