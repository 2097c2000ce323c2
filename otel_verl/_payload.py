"""Payload capture: turn arbitrary inputs/outputs into capped, redacted JSON that never raises.

One pass over the value does three things: conversion to JSON-compatible data (pydantic models,
dataclasses, numpy arrays, torch tensors without importing torch, bytes, sets, enums, cycles,
objects whose ``repr`` raises), secret redaction (sensitive keys, and values that look like keys or
bearer tokens), and a per-string cap. The JSON text is then fitted into the per-field byte budget by
shrinking strings and lists, so the result is always valid JSON and says what was cut.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import re
from collections.abc import Mapping
from datetime import date, datetime
from pathlib import PurePath
from typing import Any

REDACTED = "[REDACTED]"
TRUNCATION_MARK = "…[truncated {n} chars]"
LIST_MARK = "…[{n} more items]"
MAX_DEPTH = 32
#: arrays/tensors with more elements than this are summarised instead of listed
MAX_ARRAY_ELEMENTS = 65536

_SENSITIVE_KEY = re.compile(
    r"(pass(word|wd)?|secret|api[-_]?key|apikey|auth(orization)?|token|cookie|credential|"
    r"private[-_]?key|session[-_]?id|access[-_]?key)",
    re.IGNORECASE,
)
#: keys that contain a sensitive word but hold no secret in rollout data
_SAFE_KEYS = frozenset({
    "prompt_ids", "response_ids", "token_ids", "max_tokens", "num_tokens", "prompt_tokens",
    "completion_tokens", "total_tokens", "input_tokens", "output_tokens", "max_new_tokens",
    "token2text", "tokens", "max_tokens_per_turn", "tokenizer", "skip_special_tokens",
    "response_length", "prompt_length", "token_count", "logprobs", "top_logprobs",
    "stop_token_ids", "eos_token_id", "pad_token_id", "bos_token_id", "max_completion_tokens",
    "tokenize", "add_special_tokens", "author", "authors",
})
_SECRET_VALUE = re.compile(
    r"(?:\bBearer\s+[A-Za-z0-9._~+/=-]{8,}"          # bearer tokens
    r"|\bBasic\s+[A-Za-z0-9+/=]{12,}"                # basic auth
    r"|\bsk-[A-Za-z0-9_-]{16,}"                      # OpenAI-style keys
    r"|\b(?:local|wandb)?-?[0-9a-f]{40}\b"           # W&B API keys (40 hex, optional prefix)
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"                 # GitHub tokens
    r"|\bhf_[A-Za-z0-9]{30,}"                        # Hugging Face tokens
    r"|\bAKIA[0-9A-Z]{16}\b)"                        # AWS access key ids
)

# cheap pre-checks (C speed) before the regular expressions above: a literal scan for the
# prefixes, and a byte translation that turns any run of 40 hex characters into b"x" * 40
# (a regular expression scanning token-id lists for 40-hex runs costs ~10x more)
_SECRET_HINTS = re.compile(r"Bearer|Basic |sk-|gh[pousr]_|hf_|AKIA")
_HEX_MASK = bytes(ord("x") if chr(i) in "0123456789abcdef" else ord(" ") for i in range(256))
_HEX_RUN = b"x" * 40
_KEY_WORDS = ("pass", "secret", "api", "auth", "token", "cookie", "credential", "private",
              "session", "access")


def _may_hold_secret(text: str) -> bool:
    if _SECRET_HINTS.search(text) is not None:
        return True
    return _HEX_RUN in text.encode("utf-8", "surrogatepass").translate(_HEX_MASK)


@functools.lru_cache(maxsize=4096)
def is_sensitive_key(key: str) -> bool:
    """True for dict keys whose values must never leave the process (api_key, password, ...)."""
    return key.lower() not in _SAFE_KEYS and _SENSITIVE_KEY.search(key) is not None


@dataclasses.dataclass
class Payload:
    """The JSON text of one field plus what happened to it on the way."""

    json: str
    truncated: bool = False
    redacted: int = 0
    error: str | None = None


class _Walker:
    """One conversion pass; counts redactions and notes problems instead of raising."""

    __slots__ = ("redact", "max_str", "redacted", "cut", "errors", "_active")

    def __init__(self, redact: bool, max_str: int) -> None:
        self.redact = redact
        self.max_str = max_str
        self.redacted = 0
        self.cut = False
        self.errors: list[str] = []
        self._active: set[int] = set()

    def walk(self, obj: Any, depth: int = 0) -> Any:
        kind = type(obj)
        if obj is None or kind is bool or kind is int:
            return obj
        if kind is float:
            return obj if math.isfinite(obj) else str(obj)
        if kind is str:
            return self._string(obj)
        if depth >= MAX_DEPTH:
            return "<max depth>"
        ident = id(obj)
        if ident in self._active:
            return "<cycle>"
        self._active.add(ident)
        try:
            return self._container(obj, kind, depth)
        except Exception as exc:  # a hostile __iter__, __getattr__, model_dump, ...
            self.errors.append(redact_text(f"{kind.__qualname__}: {type(exc).__name__}: {exc}")[:300])
            return f"<unserialisable {kind.__qualname__}>"
        finally:
            self._active.discard(ident)

    def _string(self, text: str) -> str:
        if self.redact and _may_hold_secret(text) and _SECRET_VALUE.search(text):
            text, count = _SECRET_VALUE.subn(REDACTED, text)
            self.redacted += count
        if len(text) > self.max_str:
            cut = len(text) - self.max_str
            self.cut = True
            text = text[: self.max_str] + TRUNCATION_MARK.format(n=cut)
        return text

    def _container(self, obj: Any, kind: type, depth: int) -> Any:
        if isinstance(obj, Mapping):
            return self._mapping(obj.items(), depth)
        if kind is list or kind is tuple:
            if all(type(x) is int for x in obj):  # token ids: the common large case, fast path
                return obj if kind is list else list(obj)
            return [self.walk(x, depth + 1) for x in obj]
        if isinstance(obj, (set, frozenset)):
            items = [self.walk(x, depth + 1) for x in obj]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=repr)
        if isinstance(obj, enum.Enum):
            return self.walk(obj.value, depth + 1)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            data = bytes(obj)
            head = data[:64].decode("utf-8", "backslashreplace")
            return {"__bytes__": len(data), "head": self._string(head)}
        if isinstance(obj, float):  # float subclasses, numpy floats are handled below
            return float(obj) if math.isfinite(obj) else str(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, str):
            return self._string(str(obj))
        if isinstance(obj, (datetime, date)):
            return obj.isoformat()
        if isinstance(obj, PurePath):
            return str(obj)
        array = _array_like(obj)
        if array is not None:
            return self.walk(array, depth + 1)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            items = ((f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
            return self._mapping(items, depth)
        dump = getattr(obj, "model_dump", None)
        if callable(dump) and not isinstance(obj, type):  # pydantic v2
            return self.walk(dump(), depth + 1)
        if isinstance(obj, (list, tuple)):  # namedtuples and list subclasses
            return [self.walk(x, depth + 1) for x in obj]
        return self._repr(obj)

    def _mapping(self, items: Any, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            name = key if type(key) is str else _key_text(key)
            if self.redact and is_sensitive_key(name) and value is not None:
                out[name] = REDACTED
                self.redacted += 1
            else:
                out[name] = self.walk(value, depth + 1)
        return out

    def _repr(self, obj: Any) -> str:
        try:
            text = repr(obj)
        except Exception as exc:
            return f"<{type(obj).__qualname__} whose repr raised {type(exc).__name__}>"
        return self._string(text[:1000])


def _key_text(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    try:
        return key if isinstance(key, str) else str(key)
    except Exception:
        return f"<key {type(key).__qualname__}>"


def _array_like(obj: Any) -> Any:
    """numpy arrays/scalars and torch tensors as lists or numbers, without importing either."""
    module = type(obj).__module__ or ""
    if module.startswith("numpy"):
        if hasattr(obj, "shape") and hasattr(obj, "tolist"):
            if getattr(obj, "size", 0) > MAX_ARRAY_ELEMENTS:
                return {"__array__": "numpy", "shape": list(obj.shape), "dtype": str(obj.dtype),
                        "head": obj.reshape(-1)[:16].tolist()}
            return obj.tolist()
        if hasattr(obj, "item"):
            return obj.item()
    if module.startswith("torch") and hasattr(obj, "detach") and hasattr(obj, "tolist"):
        tensor = obj.detach()
        if tensor.numel() > MAX_ARRAY_ELEMENTS:
            flat = tensor.reshape(-1)[:16].cpu()
            return {"__array__": "torch", "shape": list(tensor.shape), "dtype": str(tensor.dtype),
                    "head": flat.tolist()}
        return tensor.cpu().tolist()
    return None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


#: a JSON object key in serialised text (for a key with an escaped quote, the part after it)
_JSON_KEY = re.compile(r'"([^"\\]+)":')


class _NeedsWalk(Exception):
    """The fast path met something only the full walk handles."""


def _fast_default(obj: Any) -> Any:
    """json.dumps fallback for the fast path: common non-JSON types, else give up."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name, None) for f in dataclasses.fields(obj)}
    dump = getattr(obj, "model_dump", None)
    if callable(dump) and not isinstance(obj, type):  # pydantic v2
        return dump()
    if isinstance(obj, enum.Enum):
        return obj.value
    raise _NeedsWalk


_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                                 default=_fast_default)


def _fast_json(value: Any, max_bytes: int, redact: bool) -> str | None:
    """C-speed path for the common case: plain JSON data that fits, with no secret in sight.

    Returns None when the full walk is needed (a cycle, NaN, an unknown type, something that looks
    like a secret, or text over the budget).
    """
    try:
        text = _FAST_ENCODER.encode(value)
    except (_NeedsWalk, ValueError, TypeError, RecursionError):
        return None
    if len(text) > max_bytes // 4 and len(text.encode("utf-8")) > max_bytes:
        return None
    if redact:
        if _may_hold_secret(text) and _SECRET_VALUE.search(text):
            return None
        lowered = text.lower()
        if any(word in lowered for word in _KEY_WORDS):  # then check the keys one by one
            for key in _JSON_KEY.findall(text):
                if is_sensitive_key(key):
                    return None
    return text


def to_payload(value: Any, *, max_bytes: int, redact: bool = True) -> Payload:
    """Serialise ``value`` to JSON text of at most ``max_bytes`` UTF-8 bytes. Never raises.

    Args:
        value: anything.
        max_bytes: the field's budget; the result is always valid JSON within it (>= 256).
        redact: replace secrets (sensitive keys, key-like values) with ``[REDACTED]``.

    Returns:
        The JSON text and what was cut, redacted or could not be serialised.
    """
    max_bytes = max(256, max_bytes)
    fast = _fast_json(value, max_bytes, redact)
    if fast is not None:
        return Payload(fast)
    try:
        walker = _Walker(redact, max_str=max_bytes)
        data = walker.walk(value)
        text = _dumps(data)
    except Exception as exc:  # the walker guards itself; this is the last line of defence
        return Payload(_dumps({"__error__": f"{type(exc).__name__}: {exc}"[:200]}),
                       error=f"{type(exc).__name__}: {exc}")
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
            return data[:limit_str] + TRUNCATION_MARK.format(n=len(data) - limit_str)
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
    """Redact key-like values inside a free-text string (for attributes that are not payloads)."""
    return _SECRET_VALUE.sub(REDACTED, text)
