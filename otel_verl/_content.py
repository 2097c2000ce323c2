"""Content ids, per-trajectory delta chains and the content store (the write side).

Each LLM call records only what it adds to the trajectory's previous call (its prompt plus its
response), and every unique piece of content is stored once per process and run, in a content
store beside the trace. The format is described in ``docs/content.md``; this module is the one
place it is defined (the reader is ``otel_verl.store._content``).

Content ids (computable by anyone who has the content, e.g. a trainer-side parity check)::

    token_content_id([1, 2, 3])      # "tok:sha256:<64 hex>" over b"1,2,3,"
    message_content_id([{...}, ...])  # "msg:sha256:<64 hex>" over one JSON line per message

The bytes hashed are *concatenative*: the bytes of a list are the bytes of its items one after
the other (a token is its decimal text and a comma; a message is its compact, key-sorted JSON and
a newline), so the id of a prompt that extends another is computed from the other's hash state
plus the appended items, in O(what was appended).

Content store: ``<trace_dir>/content/<pid>-<start>.nodes``, one node per line (JSON)::

    {"id": ID, "kind": "tokens"|"messages", "len": N, "base": ID|null, "base_len": n,
     "delta": [...]}

meaning ``content(id) = content(base)[:base_len] + delta`` (``base`` null: ``delta`` is all of
it). Nodes are written by one background thread per process (messages scrubbed there, once per
unique node, when redaction is on), bounded by ``content_store_bytes`` per process: a node over
the budget is not written, counted (``content_dropped``) and said once in the log, and the span
that refers to it says ``otel_verl.content.stored = "missing"``.

Usage (what ``otel_verl._capture`` does per LLM call)::

    chain = chains_of(trajectory.content, "prompt_ids", KIND_TOKENS)  # per trajectory, field
    step = chain.begin(prompt_ids)              # prefix check + delta + id, O(delta)
    store.put(KIND_TOKENS, step)                # once per unique id, off the loop
    ...span attributes from step...
    chain.finish(step.id, step.length, response_ids, span_id)  # the base of the next call
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Sequence
from typing import Any

_orjson: Any = None
try:  # the fast encoder (a core dependency)
    import orjson

    _orjson = orjson
except ImportError:  # pragma: no cover - depends on the environment
    pass

__all__ = [
    "KIND_MESSAGES",
    "KIND_TOKENS",
    "ContentStore",
    "DeltaChain",
    "Step",
    "message_bytes",
    "message_content_id",
    "store_for",
    "token_bytes",
    "token_content_id",
]

_log = logging.getLogger("otel_verl")

FORMAT_VERSION = 1
KIND_TOKENS = "tokens"
KIND_MESSAGES = "messages"
#: id prefixes by kind; the hash name follows, then the hex digest
_PREFIX = {KIND_TOKENS: "tok:sha256:", KIND_MESSAGES: "msg:sha256:"}
#: the content store's folder under the trace dir
CONTENT_DIR = "content"
#: the suffix of a content store file (not a span file: the span readers skip it)
NODES_SUFFIX = ".nodes"
#: bytes that orjson writes for anything but an int (float, true/false/null, string, container)
_NOT_INT = (b".", b"e", b'"', b"[", b"{", b"n", b"t", b"f")


def _hasher() -> Any:
    # SHA-256: the common digest (OCI, Weave's refs), and where the CPU has SHA extensions about
    # 2x faster than BLAKE2b on long token lists (measured: 800 KB in 1.0 ms against 2.3 ms)
    return hashlib.sha256()


# --- canonical bytes and ids -------------------------------------------------------------------


def token_bytes(ids: Sequence[int]) -> bytes | None:
    """The hashed bytes of a token list: each id's decimal text followed by a comma (``b"1,2,"``).

    None when the list holds anything but plain ints within 64 bits (then it is not
    delta-coded). C speed (orjson) for lists and tuples.
    """
    if not ids:
        return b""
    if _orjson is not None:
        try:
            data = _orjson.dumps(ids if type(ids) is list else list(ids))
        except Exception:  # a big int, a numpy scalar, anything else
            return None
        body = data[1:-1]
        # only ints came out: no float ("." or "e"), bool, null, string or container; one
        # memchr-speed scan per character (a translate() of the whole text costs 8x more), in
        # a plain loop (a generator costs a resume per character)
        for mark in _NOT_INT:
            if mark in body:
                return None
        return body + b","
    if any(type(i) is not int for i in ids):  # pragma: no cover - without orjson
        return None
    return "".join(f"{i}," for i in ids).encode("ascii")  # pragma: no cover


def _dumps_sorted(value: Any) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS | _orjson.OPT_NON_STR_KEYS)
        except Exception:
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str).encode("utf-8", "surrogatepass")


def message_bytes(messages: Sequence[Any]) -> bytes | None:
    """The hashed bytes of a message list: each message's compact JSON, keys sorted, then
    ``b"\\n"``. None when a message cannot be encoded."""
    try:
        return b"".join(_dumps_sorted(m) + b"\n" for m in messages)
    except Exception:
        return None


def _content_id(kind: str, hasher: Any) -> str:
    return _PREFIX[kind] + hasher.hexdigest()


def token_content_id(ids: Sequence[int]) -> str | None:
    """The content id of a whole token list (what a trainer computes to match a span's)."""
    data = token_bytes(ids)
    if data is None:
        return None
    hasher = _hasher()
    hasher.update(data)
    return _content_id(KIND_TOKENS, hasher)


def message_content_id(messages: Sequence[Any]) -> str | None:
    """The content id of a whole message list."""
    data = message_bytes(messages)
    if data is None:
        return None
    hasher = _hasher()
    hasher.update(data)
    return _content_id(KIND_MESSAGES, hasher)


def kind_of(content_id: str) -> str | None:
    """``tokens`` / ``messages`` from an id's prefix (None for anything else)."""
    for kind, prefix in _PREFIX.items():
        if content_id.startswith(prefix):
            return kind
    return None


# --- per-trajectory delta chains ---------------------------------------------------------------


class Step:
    """One call's prompt as the chain sees it: its id and length, what it extends, the delta."""

    __slots__ = ("base_id", "base_len", "base_span_id", "delta", "delta_bytes", "hasher", "id",
                 "length")

    def __init__(self, content_id: str, length: int, hasher: Any, delta: list[Any],
                 delta_bytes: bytes, base_id: str | None, base_len: int,
                 base_span_id: str | None) -> None:
        self.id = content_id
        self.length = length
        self.hasher = hasher
        self.delta = delta
        self.delta_bytes = delta_bytes
        self.base_id = base_id
        self.base_len = base_len
        self.base_span_id = base_span_id

    #: a step whose id is computed later (``PendingStep``)
    pending = False

    def resolve(self) -> bool:
        """The id is known (always, for a step computed at once)."""
        return True


#: a whole prompt of at least this many tokens (that extends nothing) is hashed off the calling
#: thread (``DeltaChain.begin(defer_over=...)``): below it the hash costs less than a hand-over
DEFER_MIN_ITEMS = 2048
#: tokens encoded per piece off the thread: the GIL is free between pieces (orjson holds it for
#: a whole list; ~0.1 ms per piece), and the hash itself runs without it
DEFER_CHUNK = 8192
#: tokens at the head of a deferred prompt encoded at once (its preview on the span, and a first
#: check that the list holds plain ints)
DEFER_HEAD = 1024
#: a whole message list with at least this many characters of text (that extends nothing) is
#: encoded and hashed off the calling thread, as a long token prompt is: turn 1 of a long
#: conversation (its system prompt, a long document) is O(context) bytes to encode and hash
DEFER_MIN_CHARS = 16384
#: messages encoded per piece off the thread (the GIL is free between pieces)
DEFER_MESSAGES = 16


def message_chars(messages: Sequence[Any]) -> int:
    """The characters of a message list's string contents: what sizes its encoding, in
    O(number of messages) (nothing is encoded)."""
    total = 0
    for message in messages:
        if type(message) is dict:
            content = message.get("content")
            if type(content) is str:
                total += len(content)
    return total


#: the locks under which a deferred step is computed once (``PendingStep.resolve``,
#: ``ExtendStep.check``), picked by the step's id(): a lock per step is one more object for the
#: cyclic GC per LLM call; two steps share one only by chance (1 in ``len(_STEP_LOCKS)``)
_STEP_LOCKS = tuple(threading.Lock() for _ in range(64))


def _step_lock(step: object) -> threading.Lock:
    return _STEP_LOCKS[(id(step) >> 4) % len(_STEP_LOCKS)]


def _reinit_step_locks() -> None:
    """In a forked child: a lock the parent's content thread held at the fork stays held there
    (a step the child resolves itself must not wait on it)."""
    for lock in _STEP_LOCKS:
        lock._at_fork_reinit()  # type: ignore[attr-defined]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_step_locks)


class PendingStep(Step):
    """A whole prompt whose encode and hash happen off the event loop (turn 1 of a long
    context: O(context) work that is not needed until the call ends).

    ``id``, ``hasher`` and ``delta_bytes`` are None until ``resolve()``; the content thread
    (``defer``) resolves it while the engine runs, and the call's end (or the chain's next use)
    resolves it if that thread has not come by yet: whichever comes first computes it, under
    the step's lock, once. It encodes the chain's own copy of the prompt (``source``, never
    the caller's list, which an agent loop may extend in place), whose first ``length`` items
    never change. Resolving also stores the node (``store.put``): ``stored`` says how it went.
    """

    __slots__ = ("_done", "_kind", "after", "after_value", "copy", "head_bytes",
                 "lazy", "root_span", "source", "store", "stored")

    pending = True

    def __init__(self, kind: str, source: list[Any], length: int, delta: list[Any],
                 head_bytes: bytes, lazy: bool = False) -> None:
        super().__init__(None, length, None, delta, None, None, 0, None)  # type: ignore[arg-type]
        self._kind = kind
        self.source = source
        #: ``source`` is the caller's list (unchanged while its call runs), not the chain's copy:
        #: the copy of its first ``length`` items (``copy``) is made where the step is resolved
        #: (off the loop, as a rule; ``DeltaChain.begin(lazy=True)``)
        self.lazy = lazy
        self.copy: list[Any] | None = None
        self.head_bytes = head_bytes
        self.store: Any = None
        self.stored: str | None = None
        #: the trajectory span that takes this prompt's id (``otel_verl.content.prompt_id``)
        self.root_span: Any = None
        #: more work that waits for this prompt, done where it is resolved (off the loop, as a
        #: rule): ``after_value = after()`` (e.g. the preview of turn 1's messages on the span)
        self.after: Any = None
        self.after_value: Any = None
        self._done = False

    def resolve(self) -> bool:
        """Compute the id (and store the node) unless done; False when the prompt turned out
        not to be plain ints (not delta-coded: the span says ``stored=missing``)."""
        if not self._done:
            with _step_lock(self):
                if not self._done:
                    self._compute()
                    after, self.after = self.after, None
                    if after is not None:  # (never raises: ``_capture._MessagesHead``)
                        self.after_value = after()
                    self._done = True
        return self.id is not None

    def _compute(self) -> None:
        items, n = self.source, self.length
        if self.lazy:  # the chain's copy, O(context): here, not on the loop
            items = _own_copy(items if len(items) == n else items[:n])
            self.copy = items
        hasher = _hasher()
        parts: list[bytes] = []
        tokens = self._kind == KIND_TOKENS
        piece = DEFER_CHUNK if tokens else DEFER_MESSAGES
        for at in range(0, n, piece):
            chunk = items[at:min(n, at + piece)]
            data = token_bytes(chunk) if tokens else message_bytes(chunk)
            if data is None:
                self.source = []
                return
            hasher.update(data)  # without the GIL (hashlib, over 2 KiB)
            parts.append(data)
        self.delta_bytes = b"".join(parts)
        self.hasher = hasher
        self.id = _content_id(self._kind, hasher)
        self.source = []  # the chain keeps its copy; this step needs it no more
        if self.lazy:
            self.delta = items  # (the node's items: the copy, not the caller's list)
        store, self.store = self.store, None
        if store is not None:
            try:
                self.stored = store.put(self._kind, self)
            except Exception:  # noqa: BLE001 - counted as missing, never a wrong rebuild
                self.stored = "missing"


#: a prompt of at least this many tokens that extends the chain's previous call as far as O(1)
#: tells (``_ends_match``) is recorded as that extension at once, its prefix checked off the
#: calling thread (``ExtendStep``): below it the check costs less than a hand-over
VERIFY_MIN_ITEMS = 2048


class ExtendStep(Step):
    """A prompt recorded at once as what it appends to the chain's previous call (O(what it
    appends) on the calling thread), whose O(context) check, that the rest of it equals the
    chain's copy, runs off the thread (``defer``) while the call runs. ``check()`` (whoever
    comes first, once, under the step's lock) says whether it holds; where it does not (a
    prompt edited in place of a long context, whose first and last items stayed) the chain
    undoes the step (``DeltaChain._settle``) and ``DeltaChain.redo`` records the call as
    ``begin`` would have.

    It reads the caller's list (``source``), which must not change while its call runs, as the
    engine reads it (the call's end settles it before the caller goes on)."""

    __slots__ = ("_checked", "_held", "inputs", "ok", "prev", "source")

    def __init__(self, content_id: str, length: int, hasher: Any, delta: list[Any],
                 delta_bytes: bytes, base_id: str, base_len: int, base_span_id: str | None,
                 source: list[Any], held: list[Any], prev: tuple[Any, ...]) -> None:
        super().__init__(content_id, length, hasher, delta, delta_bytes, base_id, base_len,
                         base_span_id)
        self.source: list[Any] | None = source
        self._held: list[Any] | None = held
        #: the chain's state before this step (``DeltaChain._undo``)
        self.prev = prev
        #: what the call's inputs were (``_capture``: the call recorded again, on a mismatch)
        self.inputs: Any = None
        self.ok = False
        self._checked = False

    def check(self) -> bool:
        """The first ``length`` items of the caller's list equal the chain's copy (computed
        once; the references to both lists are let go of when it holds)."""
        if not self._checked:
            with _step_lock(self):
                if not self._checked:
                    held, source, n = self._held, self.source, self.length
                    try:
                        self.ok = held is not None and source is not None and (
                            held == source if len(held) == n == len(source)
                            else held[:n] == source[:n])
                    except Exception:  # noqa: BLE001 - an item whose __eq__ raised
                        self.ok = False
                    self._held = None
                    if self.ok:
                        self.source = None
                    self._checked = True
        return self.ok

    def resolve(self) -> bool:
        """(the content thread's entry point) ``check()``; the id is known either way."""
        self.check()
        return True


class _Deferred:
    """The content-hash thread: resolves ``PendingStep``s in the order they came, one at a
    time, while the calls they belong to wait on their engine (and empties gone chains'
    copies, ``_Spare``). Started on first use (again in a
    forked child: a step a parent queued is resolved by whoever needs it)."""

    def __init__(self) -> None:
        # a SimpleQueue: put/get in C, no Python-level Condition on the event loop per submit
        self._queue: queue.SimpleQueue[PendingStep | ExtendStep | _Spare | _Mark] = queue.SimpleQueue()
        self._start = threading.Lock()  # taken only to start the thread (first use, after fork)
        self._pid = 0

    def submit(self, step: PendingStep | ExtendStep | _Spare | _Mark) -> None:
        if self._pid != os.getpid():
            with self._start:
                if self._pid != os.getpid():
                    self._queue = queue.SimpleQueue()  # a forked child: the parent's queue stays
                    threading.Thread(target=self._run, args=(self._queue,),
                                     name="otel_verl-content-hash", daemon=True).start()
                    self._pid = os.getpid()
        self._queue.put(step)

    @staticmethod
    def _run(steps: queue.SimpleQueue[PendingStep | ExtendStep | _Spare | _Mark]) -> None:
        while True:
            step = steps.get()
            try:
                step.resolve()
            except Exception as exc:  # noqa: BLE001 - the caller resolves it again, or says so
                _log.debug("otel_verl: deferred content hash failed: %r", exc)


_DEFERRED = _Deferred()


class _Mark:
    """A place in the content thread's queue (``wait_idle``)."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def resolve(self) -> bool:
        self.event.set()
        return True


def wait_idle(timeout: float) -> bool:
    """Wait until the content thread has done what was handed to it before this call (hashes,
    spares); False when ``timeout`` seconds passed first."""
    mark = _Mark()
    _DEFERRED.submit(mark)
    return mark.event.wait(timeout)


def defer(step: Step, store: Any = None) -> None:
    """Resolve a pending step off the calling thread, then ``store.put`` it (no-op for a step
    computed at once)."""
    if isinstance(step, PendingStep):
        step.store = store
        _DEFERRED.submit(step)
    elif type(step) is ExtendStep:
        _DEFERRED.submit(step)


class DeltaChain:
    """The previous call of one trajectory (one input field): what the next call may extend.

    Holds its own copy of the previous prompt + response (extended in place, O(what was added)),
    the hash states at the end of the prompt and at the end of the response, and the previous
    call's span id. Not thread-safe by itself: the calls of one trajectory run on one event loop.
    """

    __slots__ = ("_full_hasher", "_full_id", "_full_len", "_items", "_kind", "_mark_ids",
                 "_marks", "_pending", "_prompt_hasher", "_prompt_id", "_prompt_len", "_span_id")

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._items: list[Any] = []
        self._prompt_len = self._full_len = 0
        self._prompt_id: str | None = None
        self._full_id: str | None = None
        self._prompt_hasher: Any = None
        self._full_hasher: Any = None
        self._span_id: str | None = None
        #: (length, id) of every node along ``_items``: where a reference may point
        #: (two flat lists: no tuple per node for the young GC to count)
        self._marks: list[int] = []
        self._mark_ids: list[str] = []
        #: the last whole prompt, while its id is computed off the thread (``PendingStep``), or
        #: the last extension, while its prefix is checked off the thread (``ExtendStep``)
        self._pending: PendingStep | ExtendStep | None = None

    def __del__(self) -> None:
        # the chain's copy goes back to the spares, unless a step not yet settled reads it
        # (``PendingStep.source``, for messages; ``ExtendStep``: its check compares it)
        try:
            pending = self._pending
            if pending is None or type(pending) is not ExtendStep and \
                    pending.source is not self._items:
                _recycle(self._items)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing to keep
            pass

    @property
    def kind(self) -> str:
        return self._kind

    def _encode(self, items: Sequence[Any]) -> bytes | None:
        return token_bytes(items) if self._kind == KIND_TOKENS else message_bytes(items)

    def _settle(self) -> None:
        """The pending whole prompt's id, hash state and node mark, now (resolved off the
        thread already, as a rule); a prompt that was not plain ints leaves the chain empty."""
        step, self._pending = self._pending, None
        if step is None:
            return
        if isinstance(step, ExtendStep):
            if not step.check():
                self._undo(step)
            return
        if step.resolve():
            if step.copy is not None:  # tokens: the copy made where it was resolved
                self._items = step.copy
                step.copy = None
            self._prompt_id = self._full_id = step.id
            self._prompt_hasher = step.hasher.copy()
            self._full_hasher = step.hasher
            if self._marks and self._marks[0] == step.length:
                self._mark_ids[0] = step.id
        else:  # nothing recorded for it: the next call is recorded whole
            self._items = []
            self._marks, self._mark_ids = [], []
            self._prompt_len = self._full_len = 0
            self._prompt_id = self._full_id = None
            self._prompt_hasher = self._full_hasher = None
            self._span_id = None

    def begin(self, items: Sequence[Any], defer_over: int = 0,
              lazy: bool = False) -> Step | None:
        """The step for a call whose input field is ``items``; None when it cannot be encoded.

        ``defer_over``: a whole prompt (one that extends nothing) of more items than this
        (tokens: at least ``DEFER_MIN_ITEMS``; messages: counted in characters of text,
        ``message_chars``, at least ``DEFER_MIN_CHARS``) comes back as a ``PendingStep``: its
        encode and hash (O(context)) are left to ``defer``/``resolve``, and the calling thread
        does only the copy the chain keeps (one C-level pass) and, for tokens, a head of it.

        ``lazy`` (tokens, with ``defer_over``; for a caller that settles the step when its call
        ends, before the caller of the call goes on: ``_capture.settle_inputs``): no O(context)
        work on the calling thread at all. The copy of a whole prompt is made where it is
        hashed; a prompt of at least ``VERIFY_MIN_ITEMS`` that extends the previous call as far
        as O(1) tells is recorded as that extension at once, and compared off the thread
        (``ExtendStep``). Both read the caller's list later: it must not change while the
        call runs (as the engine reads it meanwhile).

        The prefix check compares the previous prompt + response (else the previous prompt
        alone) with the head of ``items``: one C-level list comparison (``new[:n] == prev``, a
        pointer walk when the items are the same objects, as when a prompt is built by
        concatenation). A prompt that does not extend either is recorded whole.
        """
        if self._pending is not None:
            self._settle()
        new = items if type(items) is list else list(items)
        base_id: str | None = None
        base_len = 0
        hasher: Any = None
        full = self._full_len
        held = self._items
        delta: list[Any] | None = None
        extended = False  # ``held`` already holds ``new`` (the appended items were added)
        speculate = False  # recorded as the extension now, its prefix checked later
        if (self._full_id is not None and len(held) == full
                and _ends_match(held, new, full)):
            speculate = lazy and bool(defer_over) and self._kind == KIND_TOKENS and \
                full >= VERIFY_MIN_ITEMS  # the comparison: off the thread (ExtendStep)
            if len(new) == full:
                extended = speculate or new == held
            else:  # append the rest, then one C-level comparison of equal-length lists: no
                delta = new[full:]  # copy of the long prefix (``new[:full] == held`` makes one)
                held.extend(delta)
                extended = speculate or held == new
                if not extended:
                    del held[full:]
            if extended:
                base_id, base_len, hasher = self._full_id, full, self._full_hasher.copy()
        if (base_id is None and self._prompt_id is not None and self._prompt_len != full
                and _is_prefix(held, new, self._prompt_len)):
            base_id, base_len = self._prompt_id, self._prompt_len
            hasher = self._prompt_hasher.copy()
        if delta is None or not extended:
            # a message node is written from its delta later, on the store's thread: a copy,
            # not the caller's list (which may grow in place meanwhile); O(messages)
            delta = new[base_len:] if base_len or self._kind != KIND_TOKENS else new
        if base_id is None and defer_over:
            if self._kind == KIND_TOKENS:
                if len(new) > max(defer_over, DEFER_MIN_ITEMS):
                    return self._begin_deferred(new, lazy)
            elif message_chars(new) > max(defer_over, DEFER_MIN_CHARS):
                return self._begin_deferred(new, False)
        data = self._encode(delta)
        if data is None:
            if extended:
                del held[full:]  # the chain stays where it was
            return None
        if hasher is None:
            hasher = _hasher()
        hasher.update(data)
        step: Step
        if speculate and base_id is not None:
            extension = ExtendStep(
                _content_id(self._kind, hasher), len(new), hasher, delta, data, base_id,
                base_len, self._span_id, new, held,
                (self._prompt_id, self._prompt_len, self._prompt_hasher, self._full_id,
                 self._full_len, self._full_hasher, self._span_id, len(self._marks)))
            self._pending = step = extension
        else:
            step = Step(_content_id(self._kind, hasher), len(new), hasher, delta, data, base_id,
                        base_len, self._span_id if base_id is not None else None)
        # the chain moves to this prompt now (a failed call is still the next call's base)
        if base_id is not None:
            if not extended:
                del held[base_len:]
                held.extend(delta)
            while self._marks and self._marks[-1] > base_len:
                self._marks.pop()
                self._mark_ids.pop()
        else:
            self._items = _own_copy(new)
            _recycle(held)  # settled above: no pending step encodes it
            self._marks = []
            self._mark_ids = []
        if not self._marks or self._marks[-1] != step.length:
            self._marks.append(step.length)
            self._mark_ids.append(step.id)
        self._prompt_len = self._full_len = step.length
        self._prompt_id = self._full_id = step.id
        self._prompt_hasher = hasher.copy()
        self._full_hasher = hasher
        self._span_id = None
        return step

    def _begin_deferred(self, new: list[Any], lazy: bool) -> Step | None:
        if self._kind == KIND_TOKENS:
            head = token_bytes(new[:DEFER_HEAD])
            if head is None or type(new[-1]) is not int:  # not plain ints: not delta-coded
                return None
            delta = new
        else:  # messages: the node is written from its delta, so it is a copy (the caller's
            head = b""  # list may grow in place before the store's thread writes it)
            delta = list(new)
        old = self._items
        if lazy and self._kind == KIND_TOKENS:
            # the chain's copy is made where the step is resolved (off the loop, as a rule):
            # the caller's list does not change while its call runs, and the call's end
            # resolves the step before the caller goes on
            self._items = []
            step = PendingStep(self._kind, new, len(new), delta, head, lazy=True)
        else:  # the chain's copy: the step encodes it (the caller's may change)
            self._items = _own_copy(new)
            step = PendingStep(self._kind, self._items, len(new), delta, head)
        _recycle(old)  # settled in begin: no pending step encodes it
        self._marks, self._mark_ids = [step.length], [""]
        self._prompt_len = self._full_len = step.length
        self._prompt_id = self._full_id = None
        self._prompt_hasher = self._full_hasher = None
        self._span_id = None
        self._pending = step
        return step

    def _undo(self, step: ExtendStep) -> None:
        """The chain back where it was before ``step`` (whose prefix did not hold)."""
        (self._prompt_id, self._prompt_len, self._prompt_hasher, self._full_id, self._full_len,
         self._full_hasher, self._span_id, marks) = step.prev
        del self._items[self._full_len:]
        del self._marks[marks:]
        del self._mark_ids[marks:]

    def redo(self, step: ExtendStep) -> Step | None:
        """The call of ``step``, whose prefix turned out changed, recorded as ``begin`` records
        a prompt that does not extend the previous call (on the calling thread: the rare
        path), when no later call began since; else as a whole prompt of its own. None when
        its prompt cannot be encoded."""
        if self._pending is step:
            self._settle()
        source, step.source = step.source, None
        if source is None:
            return None
        items = source if len(source) == step.length else source[:step.length]
        prev = step.prev
        if self._pending is None and self._full_id == prev[3] and self._full_len == prev[4]:
            return self.begin(items)
        return root_step(self._kind, items)

    def finish(self, content_id: str, length: int, response: Sequence[Any] | None,
               span_id: str | None) -> Step | None:
        """After the call whose prompt was ``content_id`` (``length`` items): its response
        extends the prompt (the next call's base), its span is the turn the next call continues.

        Returns the response's node (base = the prompt), or None when there is no response,
        it cannot be encoded, or another call of the trajectory began meanwhile.
        """
        if self._pending is not None:
            self._settle()
        if self._prompt_id != content_id or self._full_len != length:
            return None  # another call moved the chain on
        self._span_id = span_id
        if not response:
            return None
        items = response if type(response) is list else list(response)
        data = self._encode(items)
        if data is None:
            return None
        hasher = self._full_hasher.copy()
        hasher.update(data)
        node = Step(_content_id(self._kind, hasher), length + len(items), hasher, items, data,
                    content_id, length, span_id)
        self._items.extend(items)
        self._marks.append(node.length)
        self._mark_ids.append(node.id)
        self._full_len = node.length
        self._full_id = node.id
        self._full_hasher = hasher
        return node

    def reference(self, value: list[Any]) -> dict[str, Any] | None:
        """``value`` as a reference into this chain's content, when it is a prefix of it plus
        an appended rest (``{"$content": id, "len": n, "delta": rest}``) or a run between two
        of its nodes (``{"$content": id, "start": s, "len": n}``: ``content(id)[s:s+n]``);
        None otherwise. C-level comparisons of ``len(value)`` items at most per candidate."""
        if self._pending is not None:
            self._settle()
        n = len(value)
        items = self._items
        marks, ids = self._marks, self._mark_ids
        for at in range(len(marks) - 1, -1, -1):
            length, content_id = marks[at], ids[at]
            if _is_prefix(items, value, length):
                return {REF_KEY: content_id, "len": length, "delta": value[length:]}
        starts = set(marks)
        for end, content_id in zip(marks, ids, strict=True):
            start = end - n
            if start > 0 and start in starts and items[start:end] == value:
                return {REF_KEY: content_id, "start": start, "len": n}
        return None


def _ends_match(items: list[Any], new: list[Any], n: int) -> bool:
    """The first and the ``n``-th item of both agree (both at least ``n`` long): O(1), so a
    prompt that does not extend fails without a pass over it."""
    if n > len(new) or n > len(items):
        return False
    return n == 0 or (new[n - 1] == items[n - 1] and new[0] == items[0])


#: spare room in the chain's own copy of a prompt: what the following turns append to it goes
#: in without the list growing (a grown list is a copy of the whole context)
_ROOM = [0] * 4096

#: emptied lists of chains that are gone, taken again for the next chains' copies
#: (``_own_copy``). A list that has lived through collections sits in the cyclic GC's oldest
#: generation, which only a full collection scans; a fresh context-long copy is scanned by the
#: next young collection and again by the next middle one (at 128k tokens and 64 trajectories
#: in flight, ~1.2 ms of GC per trajectory: bench/bench_content_gc.py). Emptied, a spare
#: costs only the list object itself; at most ``_SPARE_MAX`` are kept.
#: The oldest spare is taken first: a list that held a copy for a while (not a chain's first,
#: empty one) has most likely been promoted already.
_SPARE: collections.deque[list[Any]] = collections.deque()
_SPARE_MAX = 4096


#: a list at least this long is emptied by the content thread, not by the caller (emptying
#: releases every item: ~40 us for a 128k-token copy, at the end of each trajectory's chain)
_CLEAR_OFF_LOOP = 4096


class _Spare:
    """A gone chain's copy, emptied on the content thread (``_Deferred``), then kept as a
    spare (or let go, past ``_SPARE_MAX``)."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def resolve(self) -> bool:
        items, self.items = self.items, []
        _keep_spare(items)
        return True


def _keep_spare(items: list[Any]) -> None:
    items.clear()
    if len(_SPARE) < _SPARE_MAX:
        _SPARE.append(items)  # append/popleft: atomic under the GIL, any thread


def _recycle(items: list[Any]) -> None:
    """Empty ``items`` (nobody else holds it) and keep it for a later chain's copy, if it held
    one (a chain's first, empty list is as young as the chain). A long one is emptied off the
    calling thread (the content thread: ``_Spare``)."""
    if not items:
        return
    if len(items) >= _CLEAR_OFF_LOOP:
        _DEFERRED.submit(_Spare(items))
    elif len(_SPARE) < _SPARE_MAX:
        _keep_spare(items)


def _own_copy(items: list[Any]) -> list[Any]:
    """A copy of ``items`` (the chain's own) with room for ``len(_ROOM)`` more items, in a list
    a gone chain left (an old object for the GC, see ``_SPARE``) where there is one: one C-level
    pass, as ``list(items)``, and no regrowth (a reallocation and copy of the whole context)
    when the next turns extend it."""
    try:
        copy = _SPARE.popleft()
    except IndexError:
        copy = []
    copy.extend(items)
    copy.extend(_ROOM)  # within extend's over-allocation (1/8) from 32k items on: no copy
    del copy[len(items):]  # a list keeps its allocation when shrunk by less than half
    return copy


def _is_prefix(items: list[Any], new: list[Any], n: int) -> bool:
    """``new[:n] == items[:n]`` (both at least ``n`` long, else False), with as few copies as
    possible: the ends first (a prompt that does not extend fails in O(1)), then one C-level
    comparison of equal-length lists.

    ``items`` is the chain's own list (nobody else holds it): where it costs less than slicing
    the ``n``-item prefixes (a long context, a short tail), it is brought to ``new``'s length
    in place (its tail set aside, ``new``'s tail appended: O(the tails)), compared, and put back
    as it was; the caller's ``new`` is never changed."""
    if not _ends_match(items, new, n):
        return False
    if n == 0:
        return True
    over_items, over_new = len(items) - n, len(new) - n
    if over_items == 0 and over_new == 0:
        return new == items
    if over_items + over_new >= n:  # short prefixes: slices of them are the cheaper copies
        return (new[:n] if over_new else new) == (items[:n] if over_items else items)
    kept = items[n:] if over_items else None
    try:
        if kept is not None:
            del items[n:]
        if over_new:
            items.extend(new[n:])
        return items == new
    finally:
        del items[n:]
        if kept is not None:
            items.extend(kept)


#: the key of a reference object inside a payload (docs/content.md)
REF_KEY = "$content"


def root_step(kind: str, items: Sequence[Any]) -> Step | None:
    """A node holding all of ``items`` (no base): content shared wider than one trajectory's
    chain (a dataset prompt, a tool schema list), stored once by its id."""
    data = token_bytes(items) if kind == KIND_TOKENS else message_bytes(items)
    if data is None:
        return None
    hasher = _hasher()
    hasher.update(data)
    delta = items if type(items) is list else list(items)
    return Step(_content_id(kind, hasher), len(delta), hasher, delta, data, None, 0, None)


def chains_of(holder: dict[str, Any], field: str, kind: str) -> DeltaChain:
    """The trajectory's chain for one input field (``holder`` is the trajectory's dict)."""
    chain = holder.get(field)
    if chain is None:
        chain = holder[field] = DeltaChain(kind)
    return chain


# --- the content store (write side): otel_verl._content_store, re-exported here (imported last:
# it imports the names above from this module)
from otel_verl._content_store import (  # noqa: E402, F401
    WAKE_BYTES,
    WRITE_EVERY_S,
    ContentStore,
    close_all,
    flush_all,
    node_line,
    stats_all,
    store_for,
)
