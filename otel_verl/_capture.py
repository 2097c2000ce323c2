"""Content capture: what a span records of the data it saw (payloads, exceptions, token text).

Every value that rollout code hands to a span goes through here: serialised without raising,
capped per field and per span (``max_field_bytes``, ``max_span_bytes``), redacted when
``redact`` is on, and skipped entirely when ``capture_payloads`` is off.

Usage::

    set_payload(span, input=request, output=answer)   # input.value / output.value
    span.set_attribute(key, payload_json(arguments))  # the same rules for another attribute
    span.set_attribute(key, scrub_text(message))      # free text
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from otel_verl import _errors, semconv
from otel_verl._payload import TRUNCATION_MARK, redact_text, to_payload
from otel_verl._state import STATE, Runtime

#: "argument not given" (``None`` is a value worth recording)
UNSET: Any = object()


def scrub_text(text: str, max_chars: int | None = None) -> str:
    """Redact key-like values (when redaction is on) and cap a free-text attribute value.

    For attributes outside ``input.value``/``output.value`` (tool arguments and results, error
    messages): the same rules, applied to plain text.
    """
    config = STATE.config
    if config.redact:
        text = redact_text(text)
    limit = max_chars if max_chars is not None else config.max_field_bytes
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)
    return text


def payload_json(value: Any) -> str:
    """``value`` as capped, redacted JSON text (never raises), for attributes such as
    ``gen_ai.tool.call.arguments``; the rules of ``input.value``."""
    config = STATE.config
    return to_payload(value, max_bytes=config.max_field_bytes, redact=config.redact).json


def set_payload(span: Span, *, input: Any = UNSET, output: Any = UNSET) -> None:
    """Serialise (never raises), cap, redact and set ``input.value``/``output.value`` on a span."""
    runtime = STATE.runtime
    if runtime is None or not runtime.config.capture_payloads or not span.is_recording():
        return
    try:
        existing = getattr(span, "attributes", None) or {}  # input and output arrive separately
        span.set_attributes(payload_attrs(runtime, input, output, existing))
    except Exception as exc:
        _errors.internal_error(exc, "set_payload")


def payload_attrs(runtime: Runtime, input: Any, output: Any,
                  existing: Mapping[str, Any]) -> dict[str, Any]:
    """The ``input.value``/``output.value`` attributes (and their markers) for one span."""
    config = runtime.config
    budget = config.max_span_bytes - len(existing.get(semconv.INPUT_VALUE, ""))
    attrs: dict[str, Any] = {}
    truncated: list[str] = []
    redacted = 0
    errors: list[str] = []
    for key, mime, value in ((semconv.INPUT_VALUE, semconv.INPUT_MIME_TYPE, input),
                             (semconv.OUTPUT_VALUE, semconv.OUTPUT_MIME_TYPE, output)):
        if value is UNSET:
            continue
        payload = runtime.payload(value, min(config.max_field_bytes, max(256, budget)))
        budget -= len(payload.json)
        attrs[key] = payload.json
        attrs[mime] = semconv.MIME_JSON
        if payload.truncated:
            truncated.append(key)
        redacted += payload.redacted
        if payload.error:
            errors.append(payload.error)
    if truncated:
        attrs[semconv.OTEL_VERL_TRUNCATED] = [*existing.get(semconv.OTEL_VERL_TRUNCATED, ()),
                                              *truncated]
    if redacted:
        attrs[semconv.OTEL_VERL_REDACTED] = existing.get(semconv.OTEL_VERL_REDACTED, 0) + redacted
    if errors:
        previous = existing.get(semconv.OTEL_VERL_PAYLOAD_ERROR)
        if previous:
            errors.insert(0, str(previous))
        attrs[semconv.OTEL_VERL_PAYLOAD_ERROR] = "; ".join(errors)[:1000]
    return attrs


def record_failure(span: Span, exc: BaseException) -> None:
    """``record_exception`` + status ERROR, with the message and traceback capped like payloads.

    Never raises, also for an exception whose ``__str__`` raises (the status is set first).
    Redaction of the message and stacktrace happens at span end, with everything else.
    """
    try:
        if not span.is_recording():
            return
        kind = type(exc)
        type_name = kind.__qualname__ if kind.__module__ == "builtins" else \
            f"{kind.__module__}.{kind.__qualname__}"
        try:
            message = _cap(str(exc))
        except Exception:
            message = f"<{kind.__qualname__} whose __str__ raised>"
        span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {message}"[:1024]))
        try:
            trace_text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
        except Exception:
            trace_text = f"{type_name}: {message}"
        span.add_event("exception", {
            "exception.type": type_name,
            "exception.message": message,
            "exception.stacktrace": _cap(trace_text),
            "exception.escaped": False,
        })
    except Exception as inner:
        _errors.internal_error(inner, "recording an exception")


def _cap(text: str) -> str:
    if type(text) is not str:
        text = str.__str__(text)
    limit = STATE.config.max_field_bytes
    if len(text) > limit:
        text = text[:limit] + TRUNCATION_MARK.format(n=len(text) - limit)
    return text


def as_dict(output: Any) -> dict[str, Any]:
    """A traced output as a dict (to add token2text fields to a copy of it).

    Only real mappings, dataclasses and pydantic models are unpacked (by ``type()``, nothing
    called on anything else); other outputs go under ``"output"``.
    """
    kind = type(output)
    if issubclass(kind, Mapping):
        return dict(output)
    if dataclasses.is_dataclass(kind):
        return {f.name: object.__getattribute__(output, f.name) for f in dataclasses.fields(kind)}
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(kind, pydantic.BaseModel):
        values = object.__getattribute__(output, "__dict__")
        return {name: values[name] for name in kind.model_fields if name in values}
    return {"output": output}


# token2text: decoded text of prompt/response ids, added to a copy of the traced output ---------

_TEXT_FIELDS = (("prompt_ids", "prompt_text"), ("response_ids", "response_text"),
                ("token_ids", "response_text"))


def token_texts(owner: Any, kwargs: dict[str, Any], output: Any) -> dict[str, str] | None:
    """``prompt_text``/``response_text`` decoded with ``owner.tokenizer`` (None without one)."""
    decode = getattr(getattr(owner, "tokenizer", None), "decode", None)
    if decode is None:
        return None
    texts: dict[str, str] = {}
    source = as_dict(output)
    if "prompt_ids" not in source and "prompt_ids" in kwargs:  # per-turn generate(prompt_ids=...)
        source = dict(source, prompt_ids=kwargs["prompt_ids"])
    for ids_key, text_key in _TEXT_FIELDS:
        ids = source.get(ids_key)
        if ids is not None and text_key not in texts:
            if hasattr(ids, "tolist"):
                ids = ids.tolist()
            texts[text_key] = _decode(decode, ids)
    return texts or None


def _decode(decode: Any, ids: Any) -> str:
    """``decode(ids, skip_special_tokens=False)`` (Hugging Face's default, said explicitly), or
    ``decode(ids)`` as verl calls it when ``decode`` takes no such keyword."""
    try:
        return decode(ids, skip_special_tokens=False)
    except TypeError as exc:
        if "skip_special_tokens" not in str(exc):
            raise
    return decode(ids)
