"""Payload capture: arbitrary inputs/outputs as capped JSON, in O(cap), never raising.

One walk over the value converts it to JSON-compatible data and stops once the field's byte
budget is spent: a 128k-token list or a million-key dict costs about what one at the cap costs
(the rest is summarised as ``...[N more items]``). Only these are unpacked, decided by ``type()``
(which a proxy cannot fake): mappings, lists/tuples/sets/deques, real pydantic models (their
fields, without calling ``model_dump``, with the class as Weave's client records it: ``_type``,
``_class_name`` and ``_bases``), dataclasses (their fields), numpy arrays and scalars,
torch tensors (neither imported here), enums, bytes, dates, paths, UUIDs, decimals. Anything else
(a ``unittest.mock.MagicMock``, a lazy proxy, a user class) is recorded by its type name and
nothing is called on it. An exception raised by user code during the walk (a mapping whose
``items()`` raises, a dataclass field behind a failing property) becomes a note in
``Payload.error`` (the ``otel_verl.payload_error`` attribute) and the span is still exported.

Redaction here is by *key name* only (``api_key``, ``password``, ...: the structure is known
while walking). Secrets inside strings are found once, at span end, by ``otel_verl.exporters._scrub`` over
the final text of every attribute, so no string is scanned twice.

The encoder is ``orjson`` when installed (measured in ``bench/bench_capture.py``), else the
standard library's ``json``; both get the same already-bounded data.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import sys
import uuid
import weakref
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from fractions import Fraction
from math import isfinite
from pathlib import PurePath
from typing import Any

from otel_verl.exporters._scrub import REDACTED, fix_surrogates, is_sensitive_key, scrub

__all__ = ["LIST_MARK", "MAX_DEPTH", "REDACTED", "TRUNCATION_MARK", "Payload", "is_sensitive_key",
           "redact_text", "to_payload"]

TRUNCATION_MARK = "...[truncated {n} chars]"  # ASCII: keeps ASCII payloads ASCII
LIST_MARK = "...[{n} more items]"
KEYS_MARK = "[{n} more keys]"
MAX_DEPTH = 32
#: ints beyond this many bits are recorded as a note (str() of huge ints is quadratic and
#: raises beyond 4,300 digits); ints beyond 64 bits are written as strings (JSON readers lose
#: precision on them)
MAX_INT_BITS = 4096
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
#: a key longer than this is cut
MAX_KEY_CHARS = 256
_CHUNK = 512
#: characters a secret is made of: a string cut inside such a run is cut before the run, so no
#: prefix of a key is left where the span-end scan can no longer recognise it
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+/=.")

_orjson: Any = None
_Fragment: Any = None
try:  # the fast encoder (a core dependency; the stdlib json is the fallback)
    import orjson

    _orjson = orjson
    _Fragment = getattr(orjson, "Fragment", None)  # (orjson >= 3.9.6)
except ImportError:  # pragma: no cover - depends on the environment
    pass


def _dumps_std(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _dumps(value: Any) -> str:
    if _orjson is not None:
        try:
            return str(_orjson.dumps(value), "utf-8")
        except (TypeError, ValueError):  # e.g. a case the walker let through: use the reference
            pass
    return _dumps_std(value)


@dataclasses.dataclass
class Payload:
    """The JSON text of one field plus what happened to it on the way."""

    json: str
    truncated: bool = False
    redacted: int = 0
    error: str | None = None


def _type_name(kind: type) -> str:
    try:
        module = kind.__module__
        name = kind.__qualname__
        if not isinstance(module, str) or not isinstance(name, str):
            raise TypeError
    except Exception:
        return "<object>"
    return f"<{name}>" if module == "builtins" else f"<{module}.{name}>"


def _describe(kind: type, exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    return f"{_type_name(kind)[1:-1]}: {type(exc).__name__}: {message}"[:300]


def _cut_point(text: str, limit: int) -> int:
    """Where to cut ``text`` at ``limit`` characters without leaving half a secret-shaped run."""
    cut = limit
    floor = max(0, limit - 200)
    if cut < len(text) and text[cut] in _TOKEN_CHARS:
        while cut > floor and text[cut - 1] in _TOKEN_CHARS:
            cut -= 1
        if cut == floor and floor > 0:  # a run longer than any secret: cut where asked
            cut = limit
    return cut


class TokenJSON:
    """A list of token ids whose JSON is known already: the first ``count`` ids of ``items``,
    whose canonical bytes (``_content.token_bytes``: each id's decimal text and a comma) the
    content chain encoded to hash them. A payload renders it from those bytes (an orjson
    ``Fragment``), not by checking and encoding the ids again; the walk (a payload over its
    cap) takes the ids themselves. Made by ``token_json`` only."""

    __slots__ = ("count", "data", "items")

    items: list[int]
    count: int
    data: bytes

    def ids(self) -> list[int]:
        return self.items if self.count == len(self.items) else self.items[:self.count]


def token_json(items: list[int], encoded: bytes,
               limit: int | None = None) -> TokenJSON | list[int]:
    """``items`` for a payload, ``encoded`` being ``token_bytes`` of them (or of a longer list
    they begin, with ``limit``), or with ``limit`` the ids of its head whose bytes fit in it (a
    preview): as a ``TokenJSON`` where orjson can take already-encoded JSON, else as a list."""
    if limit is None:
        count = len(items)
        data = encoded[:-1]
    else:
        count = encoded.count(b",", 0, limit)
        data = encoded[:encoded.rfind(b",", 0, limit)] if count else b""
    if _Fragment is None:
        return items[:count]
    token = TokenJSON.__new__(TokenJSON)
    token.items, token.count = items, count
    token.data = b"[" + data + b"]"
    return token


class _Walker:
    """One budgeted conversion pass; counts redactions and notes problems instead of raising."""

    __slots__ = ("_active", "budget", "cut", "errors", "max_str", "redact", "redacted")

    def __init__(self, redact: bool, max_bytes: int) -> None:
        self.redact = redact
        self.budget = max_bytes  # JSON bytes still available (an estimate, checked at the end)
        self.max_str = max(64, max_bytes // 2)
        self.redacted = 0
        self.cut = False
        self.errors: list[str] = []
        self._active: set[int] = set()

    # -- leaves -----------------------------------------------------------------------------------
    def string(self, text: str) -> str:
        limit = max(32, min(self.max_str, self.budget))
        total = len(text)
        if total > limit:  # cut, whatever it holds (a char is at least a byte): read no more
            text = text[:limit + 1]  # of it than the cut looks at, O(cap) not O(its length)
        text = fix_surrogates(text)
        if text.isascii():
            if total > limit:
                cut = _cut_point(text, limit)
                self.cut = True
                text = text[:cut] + TRUNCATION_MARK.format(n=total - cut)
            self.budget -= len(text) + 3
            return text
        if len(text) * 4 > limit:  # maybe over the limit in UTF-8 bytes: measure
            data = text.encode("utf-8")
            if len(data) > limit:
                head = data[:limit].decode("utf-8", "ignore")
                cut = _cut_point(head + text[len(head):len(head) + 1], len(head))
                self.cut = True
                text = text[:cut] + TRUNCATION_MARK.format(n=total - cut)
                self.budget -= len(text.encode("utf-8")) + 3
                return text
            self.budget -= len(data) + 3
            return text
        self.budget -= len(text) * 2 + 3
        return text

    def integer(self, value: int) -> Any:
        if _INT64_MIN <= value <= _UINT64_MAX:
            self.budget -= 8
            return value
        bits = value.bit_length()
        if bits > MAX_INT_BITS:
            self.budget -= 24
            return f"<int of {bits} bits>"
        text = str(value)
        self.budget -= len(text) + 3
        return text

    # -- the walk ---------------------------------------------------------------------------------
    def walk(self, obj: Any, depth: int = 0) -> Any:
        kind = type(obj)
        if kind is str:
            return self.string(obj)
        if obj is None or kind is bool:
            self.budget -= 5
            return obj
        if kind is int:
            return self.integer(obj)
        if kind is float:
            self.budget -= 12
            return obj if math.isfinite(obj) else str(obj)
        if kind is TokenJSON:
            obj, kind = obj.ids(), list
        if depth >= MAX_DEPTH:
            self.budget -= 12
            return "<max depth>"
        ident = id(obj)
        if ident in self._active:
            self.budget -= 8
            return "<cycle>"
        self._active.add(ident)
        try:
            return self._container(obj, kind, depth)
        except Exception as exc:  # user code raised (items(), a property, __iter__, ...)
            self.errors.append(_describe(kind, exc))
            self.budget -= 32
            return f"<unserialisable {_type_name(kind)[1:-1]}>"
        finally:
            self._active.discard(ident)

    def _container(self, obj: Any, kind: type, depth: int) -> Any:
        if kind is dict:
            return self._mapping(obj, dict.items(obj), depth)
        if kind is list or kind is tuple:
            return self._sequence(obj, depth)
        if issubclass(kind, enum.Enum):
            return self.walk(object.__getattribute__(obj, "_value_"), depth + 1)
        if issubclass(kind, str):
            return self.string(str.__str__(obj))
        if issubclass(kind, int):  # int subclasses (bool was handled); IntEnum is an Enum
            return self.integer(int.__int__(obj))
        if issubclass(kind, float):  # float subclasses, numpy.float64
            value = float.__float__(obj)
            self.budget -= 12
            return value if math.isfinite(value) else str(value)
        if issubclass(kind, Mapping):
            return self._mapping(obj, obj.items(), depth)
        if issubclass(kind, (list, tuple)):  # subclasses, namedtuples: their items, not __iter__
            return self._sequence(list.__iter__(obj) if issubclass(kind, list)
                                  else tuple.__iter__(obj), depth)
        if issubclass(kind, (set, frozenset, collections.deque)):
            return self._unordered(obj, kind, depth)
        if issubclass(kind, (bytes, bytearray, memoryview)):
            return self._bytes(obj, kind)
        special = self._known(obj, kind, depth)
        if special is not _UNKNOWN:
            return special
        name = _type_name(kind)
        self.budget -= len(name) + 3
        return name

    def _known(self, obj: Any, kind: type, depth: int) -> Any:
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if issubclass(kind, numpy.ndarray):
                return self._array(obj, "numpy", obj.size, obj.reshape(-1), depth)
            if issubclass(kind, numpy.generic):
                return self.walk(obj.item(), depth + 1)
        torch = sys.modules.get("torch")
        if torch is not None and issubclass(kind, torch.Tensor):
            tensor = obj.detach()
            return self._array(tensor, "torch", tensor.numel(), tensor.reshape(-1), depth)
        pydantic = sys.modules.get("pydantic")
        if pydantic is not None and issubclass(kind, pydantic.BaseModel):
            values = object.__getattribute__(obj, "__dict__")
            fields: Any = getattr(kind, "model_fields", {})  # a class attribute (pydantic v2)
            name, bases = class_record(kind)
            items: list[tuple[str, Any]] = [("_type", name)]
            items.extend((field, values.get(field)) for field in fields if field in values)
            extra = object.__getattribute__(obj, "__pydantic_extra__")
            if type(extra) is dict:
                items.extend(extra.items())
            items.extend((("_class_name", name), ("_bases", bases)))
            return self._mapping(None, items, depth)
        if dataclasses.is_dataclass(kind):
            pairs = ((name, object.__getattribute__(obj, name))
                     for name in dataclass_field_names(kind))
            return self._mapping(None, pairs, depth)
        if issubclass(kind, datetime):
            return self.string(datetime.isoformat(obj))
        if issubclass(kind, date):
            return self.string(date.isoformat(obj))
        if issubclass(kind, time):
            return self.string(time.isoformat(obj))
        if issubclass(kind, PurePath):
            return self.string(PurePath.__str__(obj))
        if issubclass(kind, uuid.UUID):
            return self.string(uuid.UUID.__str__(obj))
        if issubclass(kind, (Decimal, Fraction, complex)):
            base = next(b for b in (Decimal, Fraction, complex) if issubclass(kind, b))
            return self.string(base.__str__(obj))
        return _UNKNOWN

    # -- containers -------------------------------------------------------------------------------
    def _mapping(self, obj: Any, items: Any, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.budget -= 2
        done = 0
        for key, value in items:
            if self.budget <= 0:
                self.cut = True
                out["..."] = (KEYS_MARK.format(n=len(obj) - done) if obj is not None
                            else "[more keys]")
                break
            name = key if type(key) is str else self._key(key)
            if len(name) > MAX_KEY_CHARS:
                name = name[:MAX_KEY_CHARS] + "..."
            name = fix_surrogates(name)
            self.budget -= len(name) + 4
            if self.redact and value is not None and is_sensitive_key(name):
                out[name] = REDACTED
                self.redacted += 1
                self.budget -= len(REDACTED)
            else:
                out[name] = self.walk(value, depth + 1)
            done += 1
        return out

    def _key(self, key: Any) -> str:
        kind = type(key)
        if kind is int or kind is float or kind is bool or key is None:
            return json.dumps(key) if kind is not int else str(self.integer(key))
        if issubclass(kind, enum.Enum):
            return self._key(object.__getattribute__(key, "_value_"))
        if issubclass(kind, str):
            return str.__str__(key)
        value = self.walk(key, MAX_DEPTH - 1)  # a tuple key, a date, ...: its JSON, shallow
        return value if isinstance(value, str) else _dumps_std(value)

    def _sequence(self, obj: Any, depth: int) -> list[Any]:
        out: list[Any] = []
        self.budget -= 2
        if type(obj) is list or type(obj) is tuple:
            total = len(obj)
            start = 0
            while start < total:
                if self.budget <= 0:
                    self.cut = True
                    out.append(LIST_MARK.format(n=total - start))
                    break
                chunk = obj[start:start + _CHUNK]
                size = _plain_size(chunk)
                if size:  # token ids, scores: the common large case, at C speed
                    if size > self.budget:  # take what fits, then the count of the rest
                        keep = len(chunk) * self.budget // size
                        out.extend(chunk[:keep])
                        self.budget = 0
                        start += keep
                        continue
                    out.extend(chunk)
                    self.budget -= size
                else:
                    for item in chunk:
                        if self.budget <= 0:
                            break
                        out.append(self.walk(item, depth + 1))
                        start += 1
                    continue
                start += len(chunk)
            return out
        for item in obj:  # an iterator over a list/tuple subclass's items
            if self.budget <= 0:
                self.cut = True
                out.append("...[more items]")
                break
            out.append(self.walk(item, depth + 1))
        return out

    def _unordered(self, obj: Any, kind: type, depth: int) -> list[Any]:
        total = len(obj)
        items: list[Any] = []
        for item in obj:
            if self.budget <= 0:
                break
            items.append(self.walk(item, depth + 1))
        if kind is not collections.deque:
            try:
                items.sort()
            except TypeError:
                items.sort(key=_dumps_std)
        if len(items) < total:
            self.cut = True
            items.append(LIST_MARK.format(n=total - len(items)))
        return items

    def _bytes(self, obj: Any, kind: type) -> dict[str, Any]:
        view = memoryview(obj).cast("B") if kind is memoryview else obj
        size = len(view)
        head = bytes(view[:64]).decode("utf-8", "backslashreplace")
        self.budget -= 40
        return {"__bytes__": size, "head": self.string(head)}

    def _array(self, array: Any, library: str, size: int, flat: Any, depth: int) -> Any:
        """A numpy array or torch tensor: the whole list when it fits, else shape and a head."""
        room = max(16, self.budget // 2)  # each element takes at least 2 bytes of JSON
        if size <= room and size <= 65536:
            if library == "torch":
                array = array.cpu()
            return self.walk(array.tolist(), depth + 1)
        head = flat[: min(size, room, 4096)]
        if library == "torch":
            head = head.cpu()
        self.cut = True
        shape = [int(n) for n in array.shape]
        return {"__array__": library, "shape": shape, "dtype": str(array.dtype),
                "head": self.walk(head.tolist(), depth + 1)}


_UNKNOWN: Any = object()


def class_record(kind: type) -> tuple[str, list[str]]:
    """A pydantic model's class as Weave's client records it (``_type`` / ``_class_name`` = the
    class's ``__name__``, ``_bases`` = the names of its bases up to, not including, ``object``),
    read from the class's own ``type`` slots (nothing the model defines is called)."""
    mro = type.__dict__["__mro__"].__get__(kind)
    names = [type.__dict__["__name__"].__get__(c) for c in mro[:-1]]
    return names[0], names[1:]


_FIELD_NAMES: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def dataclass_field_names(kind: type) -> tuple[str, ...]:
    """``[f.name for f in dataclasses.fields(kind)]``, read once per class (``fields`` filters
    the class's field table on every call: a visible share of capturing a small output)."""
    try:
        names = _FIELD_NAMES.get(kind)
    except Exception:  # a class that cannot be weakly referenced or hashed: not cached
        return tuple(f.name for f in dataclasses.fields(kind))
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(kind))
        try:
            _FIELD_NAMES[kind] = names
        except Exception:  # noqa: BLE001 - as above
            pass
    return names


def _plain_size(chunk: list[Any] | tuple[Any, ...]) -> int:
    """The JSON size of a chunk of plain numbers (ints within 64 bits, finite floats, bools,
    None), with its commas; 0 when anything else is in it (then it is walked item by item)."""
    if not chunk:
        return 1
    if _orjson is not None:  # C speed: encode, then check nothing but numbers came out
        try:
            data = _orjson.dumps(chunk)
        except Exception:  # a big int, a numpy scalar, an unknown type: walk it
            return 0
        if b'"' in data or b"{" in data or data.count(b"[") != 1 or b"null" in data:
            return 0  # strings, containers, NaN (written as null) need the walk's rules
        return len(data) - 1
    try:
        if set(map(type, chunk)) != {int}:
            return 0
        low, high = min(chunk), max(chunk)
    except Exception:
        return 0
    if low < _INT64_MIN or high > _UINT64_MAX:
        return 0
    return len(chunk) * (max(len(str(high)), len(str(low))) + 1)  # an upper bound


_PLAIN_CONTAINERS = (dict, list, tuple)
#: a plain value is taken as it is when its JSON is under this share of the field's cap: then the
#: walk would cut nothing (its budget estimates at most ~6x a leaf's JSON size)
_PLAIN_SHARE = 8
#: nodes a plain value may have (beyond it: the walk, whose lists of numbers go at C speed)
_PLAIN_NODES = 512
_STR = frozenset({str})
#: key tuples of dicts already checked (no key over ``MAX_KEY_CHARS``, none to redact): the same
#: few shapes come back on every call (an op's bound inputs, its output's fields)
_KEYS_OK: set[tuple[Any, ...]] = set()
_KEYS_KEPT = 4096


#: what the walk takes apart before it looks at a dataclass (``_Walker._container``)
_BEFORE_DATACLASS = (enum.Enum, str, int, float, Mapping, list, tuple, set, frozenset,
                     collections.deque, bytes, bytearray, memoryview)


def _plain_dataclass(kind: type) -> bool:
    """A dataclass the walk records as the mapping of its fields (nothing it checks first)."""
    try:
        if issubclass(kind, _BEFORE_DATACLASS):
            return False
        for module, names in (("numpy", ("ndarray", "generic")), ("torch", ("Tensor",)),
                              ("pydantic", ("BaseModel",))):
            found = sys.modules.get(module)
            if found is not None and issubclass(kind, tuple(getattr(found, n) for n in names)):
                return False
    except Exception:  # noqa: BLE001 - a strange class: the walk decides
        return False
    return True


def _keys_ok(keys: tuple[str, ...], redact: bool) -> bool:
    """No key over ``MAX_KEY_CHARS`` and (``redact``) none that names a secret (keys: exact
    ``str``, checked by the caller)."""
    if keys in _KEYS_OK:
        return True
    if max(map(len, keys)) > MAX_KEY_CHARS:
        return False
    if any(map(is_sensitive_key, keys)):  # (a secret key whose value is None is not redacted:
        return not redact  # the walk decides that)
    if len(_KEYS_OK) >= _KEYS_KEPT:
        _KEYS_OK.clear()
    _KEYS_OK.add(keys)
    return True


def _plain_json(value: Any, max_bytes: int, redact: bool) -> str | None:
    """``value``'s JSON text when it is small and made of exact JSON types only (dict with str
    keys, list, tuple, str, int within 64 bits, finite float, bool, None) and plain dataclasses
    of them (as the mapping of their fields, as the walk records them), no key to redact, no key
    over ``MAX_KEY_CHARS``, no deeper than ``MAX_DEPTH``: exactly what the walk would produce,
    at a fraction of its cost (a small op input or output is the common case). None otherwise
    (the walk decides).

    The checks run per container at C speed (the set of its items' types, the characters of
    its strings), never per item in Python; they bound the encoder's work to O(cap) before it
    runs. What orjson refuses (lone surrogates, ints beyond 64 bits, keys that are not exactly
    ``str``) and the size of its text are checked on its result."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    nodes = chars = 0
    limit = max_bytes // _PLAIN_SHARE
    dataclasses_seen = tokens_seen = False
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return None
        kind = type(item)
        if kind is dict:
            if item:
                keys = tuple(item)  # a shape met before (only exact str keys are remembered)
                if keys not in _KEYS_OK and not (set(map(type, keys)) <= _STR and
                                                 _keys_ok(keys, redact)):
                    return None
            values: Any = item.values()
        elif kind is list or kind is tuple:
            if len(item) > 16 and _only_ints(item):  # token ids: no walk of their own
                if len(item) * 2 > limit:  # (each takes 2 bytes at least)
                    return None
                continue
            values = item
        else:  # pushed below only when it is a plain dataclass
            names = _PLAIN_CLASSES.get(kind)
            if names is None or names and not _keys_ok(names, redact):
                return None
            try:
                values = [object.__getattribute__(item, name) for name in names]
            except Exception:  # noqa: BLE001 - a failing field: the walk notes it
                return None
            dataclasses_seen = True
        nodes += len(values) + 1
        if nodes > _PLAIN_NODES:
            return None
        depth += 1
        for sub in values:
            sub_kind = type(sub)
            if sub_kind is str:
                chars += len(sub)
                if chars > limit:  # a long string: the walk cuts it, nothing encoded here
                    return None
            elif sub_kind is int or sub_kind is bool or sub is None:
                pass
            elif sub_kind is float:
                if not isfinite(sub):  # NaN, inf: the walk writes them as strings
                    return None
            elif sub_kind is dict or sub_kind is list or sub_kind is tuple:
                stack.append((sub, depth))
            elif sub_kind is TokenJSON:  # ids encoded already (a prompt's delta)
                chars += len(sub.data)
                if chars > limit:
                    return None
                tokens_seen = True
            elif _plain_fields(sub_kind) is not None:
                stack.append((sub, depth))
            else:  # not a plain dataclass: the walk decides
                return None
    try:
        if dataclasses_seen:
            data = _orjson.dumps(value, default=_fields_of,
                                 option=_orjson.OPT_PASSTHROUGH_DATACLASS)
        elif tokens_seen:
            data = _orjson.dumps(value, default=_fields_of)
        else:
            data = _orjson.dumps(value)
    except Exception:  # noqa: BLE001 - a lone surrogate, a big int, a cycle: the walk's rules
        return None
    if len(data) * _PLAIN_SHARE > max_bytes:
        return None
    return str(data, "utf-8")


def _only_ints(items: list[Any] | tuple[Any, ...]) -> bool:
    """Every item is an exact int (token ids), checked at C speed (2x ``set(map(type, ...))``)."""
    return list(map(type, items)).count(int) == len(items)


def _fields_of(obj: Any) -> Any:
    """orjson's ``default`` for a plain dataclass ``_plain_json`` checked (its fields, in
    order) and for a ``TokenJSON`` (its bytes, as they are)."""
    if type(obj) is TokenJSON:
        return _Fragment(obj.data)
    names = _PLAIN_CLASSES.get(type(obj))
    if names is None:
        raise TypeError(type(obj).__name__)
    return {name: object.__getattribute__(obj, name) for name in names}


#: a class -> its field names where it is a plain dataclass, else None (classes are few and
#: long-lived; the table is cleared when it grows past ``_CLASSES_KEPT``)
_PLAIN_CLASSES: dict[type, tuple[str, ...] | None] = {}
_CLASSES_KEPT = 1024


def _plain_fields(kind: type) -> tuple[str, ...] | None:
    try:
        return _PLAIN_CLASSES[kind]
    except KeyError:
        pass
    except Exception:  # noqa: BLE001 - an unhashable class: the walk decides
        return None
    try:
        names = dataclass_field_names(kind) if dataclasses.is_dataclass(kind) and \
            _plain_dataclass(kind) else None
    except Exception:  # noqa: BLE001 - a class that lies about its fields: the walk decides
        names = None
    if len(_PLAIN_CLASSES) >= _CLASSES_KEPT:
        _PLAIN_CLASSES.clear()
    _PLAIN_CLASSES[kind] = names
    return names


def fast_json(value: Any, max_bytes: int, redact: bool) -> str | None:
    """``to_payload(value, ...).json`` where its fast path applies (a small value of exact JSON
    types, ``_plain_json``: nothing cut, redacted or noted), else None. Its success at one
    ``max_bytes`` implies the same text at any larger one."""
    if _orjson is None:
        return None
    kind = type(value)
    if kind in _PLAIN_CONTAINERS or _plain_fields(kind) is not None:  # (a plain dataclass)
        return _plain_json(value, max(256, max_bytes), redact)
    return None


def loads_json(text: str | bytes) -> Any:
    """JSON text (a payload this module wrote) back to values."""
    if _orjson is not None:
        return _orjson.loads(text)
    return json.loads(text)  # pragma: no cover - without orjson


def to_payload(value: Any, *, max_bytes: int, redact: bool = True) -> Payload:
    """Serialise ``value`` to JSON text of at most ``max_bytes`` UTF-8 bytes. Never raises.

    Args:
        value: anything.
        max_bytes: the field's budget; the result is always valid JSON within it (>= 256).
        redact: replace the values of sensitive keys (``api_key``, ``password``, ...) with
            ``[REDACTED]`` (secrets inside strings are redacted at span end).

    Returns:
        The JSON text and what was cut, redacted or could not be serialised.
    """
    fast = fast_json(value, max_bytes, redact)
    if fast is not None:
        return Payload(fast)
    return walk_payload(value, max_bytes, redact)


def walk_payload(value: Any, max_bytes: int, redact: bool) -> Payload:
    """``to_payload`` by the budgeted walk alone (for a caller that tried ``fast_json``)."""
    max_bytes = max(256, max_bytes)
    try:
        walker = _Walker(redact, max_bytes - max(64, max_bytes // 32))  # room for the marks
        data = walker.walk(value)
        text = _dumps(data)
    except Exception as exc:  # the walker guards itself; this is the last line of defence
        note = _describe(type(value), exc)
        return Payload(_dumps_std({"__error__": note[:200]}), error=note)
    error = "; ".join(walker.errors) or None
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8")) <= max_bytes:
        return Payload(text, truncated=walker.cut, redacted=walker.redacted, error=error)
    return Payload(_fit(data, max_bytes), truncated=True, redacted=walker.redacted, error=error)


def _fit(data: Any, max_bytes: int) -> str:
    """Shrink strings and lists until the JSON fits; always returns valid JSON."""
    limit_str, limit_list = max_bytes // 2, 1024
    for _ in range(24):
        text = _dumps(_shrink(data, limit_str, limit_list))
        if len(text.encode("utf-8")) <= max_bytes:
            return text
        limit_str = max(16, limit_str // 2)
        limit_list = max(2, limit_list // 2)
    preview = _dumps(data)[: max_bytes // 2]
    text = _dumps({"__truncated__": True, "preview": preview})
    while len(text.encode("utf-8")) > max_bytes:
        preview = preview[: len(preview) * 3 // 4]
        text = _dumps({"__truncated__": True, "preview": preview})
    return text


def _shrink(data: Any, limit_str: int, limit_list: int) -> Any:
    if isinstance(data, str):
        if len(data) > limit_str:
            cut = _cut_point(data, limit_str)
            return data[:cut] + TRUNCATION_MARK.format(n=len(data) - cut)
        return data
    if isinstance(data, list):
        head = [_shrink(x, limit_str, limit_list) for x in data[:limit_list]]
        if len(data) > limit_list:
            head.append(LIST_MARK.format(n=len(data) - limit_list))
        return head
    if isinstance(data, dict):
        return {k: _shrink(v, limit_str, limit_list) for k, v in data.items()}
    return data


def redact_text(text: str) -> str:
    """Redact every secret of the catalogue inside a free-text string (see ``otel_verl.exporters._scrub``)."""
    return scrub(text)[0]
