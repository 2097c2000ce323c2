"""Redaction: one pass, at span end, over every string that leaves the process.

Capture (``_payload``) only redacts by *key name* while it walks structured data (it has the
structure; the JSON text no longer does). Everything else happens here, once per finished span,
on the export thread, for every backend alike: the span name, every attribute key and value (ours
and those of hand-made spans), event names and attributes (exception messages, notes and
stacktraces included), link attributes, the status description and the resource.

Usage::

    scrubber = build_scrubber(config)          # None when config.redact is false
    span = scrubber(span)                      # a scrubbed copy, or the same object if clean
    text, count = scrub(text)                  # the text-level pass (what ``scrub_text`` uses)

What is found (the catalogue, ``CATALOGUE``): PEM private key blocks, JWTs, OpenAI/Anthropic
``sk-`` keys, Stripe ``sk_live_``/``rk_live_``/``*_test_``, GitHub ``ghp_``/``gho_``/``ghu_``/
``ghs_``/``ghr_`` and fine-grained ``github_pat_`` tokens, Hugging Face ``hf_``, Slack ``xox*-``/
``xapp-``, Google ``AIza``, AWS access key ids (``AKIA``/``ASIA``/...), W&B keys (40 hex, optional
``local-``), credentials in URLs (``scheme://user:password@``), ``Bearer``/``Basic`` values, and
assignments to sensitive names in any text (``password=...``, ``--password ...``,
``"api_key": "..."``, ``Authorization: Token ...``, ``AWS secret: ...``), plus attributes whose
key is a sensitive name. Users add regular expressions with ``redact_patterns``
(``OTEL_VERL_REDACT_PATTERNS``).

Cost: linear in bytes. Every built-in rule starts at a literal anchor found with ``str.find``
(C speed) and is matched only there; the 40-hex rule is gated by a byte translation. The text
stays valid JSON when it was JSON: no rule matches a quote or half an escape sequence, and the
replacement contains neither. Lone surrogates (unencodable in UTF-8) become U+FFFD on the way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

__all__ = [
    "CATALOGUE",
    "REDACTED",
    "Scrubber",
    "ScrubbingSpanExporter",
    "build_scrubber",
    "is_sensitive_key",
    "scrub",
]

REDACTED = "[REDACTED]"
#: attribute carrying how many secrets were redacted on a span (capture + span end)
REDACTED_COUNT_KEY = "otel_verl.redacted"

# --- sensitive key names -------------------------------------------------------------------------

_SENSITIVE_KEY = re.compile(
    r"passw(?:or)?d|passphrase|secret|credential|api[-_.]?key|apikey|access[-_.]?key"
    r"|private[-_.]?key|auth(?!or(?:s|ity|ed|ship)?(?:[^a-z]|$))|cookie|session[-_.]?(?:id|key|token)|(?:^|[^a-z])pwd"
    r"|(?:^|[^a-z])jwt|token$",
    re.IGNORECASE,
)
#: keys that match a sensitive word but hold no secret in rollout data
_SAFE_KEYS = frozenset({
    "eos_token", "pad_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token",
    "special_token", "stop_token", "max_token", "end_token", "start_token", "last_token",
    "first_token", "next_token", "num_token", "image_token", "vision_token", "think_token",
    "tool_call_token", "author", "authors", "authority",
})
#: whole attribute names that match a sensitive word but are written by otel_verl from
#: non-secret data: OpenInference's ``session.id`` is the GRPO group (experiment/step/sample)
_SAFE_NAMES = frozenset({"session.id"})


@functools.lru_cache(maxsize=8192)
def is_sensitive_key(key: str) -> bool:
    """True for names whose values must never leave the process (``api_key``, ``password``, ...).

    Token counts and ids (``max_tokens``, ``prompt_ids``, ``token_ids``, ``eos_token``) are not.
    """
    name = key.lower()
    tail = name.rsplit(".", 1)[-1]
    if tail in _SAFE_KEYS or name in _SAFE_NAMES:
        return False
    return _SENSITIVE_KEY.search(name) is not None


# --- the catalogue -------------------------------------------------------------------------------


#: secrets with a recognisable shape; each is a run of at least 12 "token characters", so they
#: are searched only inside such runs (found with a byte translation, at C speed). The 40-hex
#: W&B key rule is last: a key with a prefix of its own wins.
_TOKEN_RULES: tuple[tuple[str, str], ...] = (
    ("jwt", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
    ("openai_anthropic", r"sk-[A-Za-z0-9_-]{16,}"),
    ("stripe", r"(?:[rs]k_(?:live|test)|whsec)_[A-Za-z0-9]{16,}"),
    ("github", r"gh[pousr]_[A-Za-z0-9]{30,}"),
    ("github_fine_grained", r"github_pat_[A-Za-z0-9_]{30,}"),
    ("huggingface", r"hf_[A-Za-z0-9]{30,}"),
    ("slack", r"(?:xox[a-z]|xapp)-[A-Za-z0-9-]{10,}"),
    ("google", r"AIza[0-9A-Za-z_-]{30,}"),
    ("aws_access_key_id", r"A(?:KI|SI|BI|CC)A[0-9A-Z]{16}(?![0-9A-Za-z])"),
    ("wandb", r"(?<![0-9a-f])(?:local-)?[0-9a-f]{40}(?![0-9a-f])"),
)
_TOKEN = re.compile("|".join(f"(?P<{name}>{regex})" for name, regex in _TOKEN_RULES))
#: rules that need a left boundary (so "task-..." is not an "sk-" key)
_NEEDS_BOUNDARY = frozenset({"openai_anthropic", "stripe", "github", "huggingface", "slack",
                             "google", "aws_access_key_id"})
_RUN_MIN = 12
#: token characters -> "x", others -> " " (non-ASCII characters were already made "?")
_RUN_MASK = bytes(ord("x") if (chr(i).isascii() and (chr(i).isalnum() or chr(i) in "_-+/=."))
                  else ord(" ") for i in range(256))
_RUN = b"x" * _RUN_MIN
#: "Authorization: Bearer <run>": a scheme word right before a run makes the run a secret
_SCHEME_BEFORE = re.compile(r"(?i:bearer|basic|token|digest|negotiate)\s+$")
_SCHEME_VALUE = re.compile(r"(?=[A-Za-z0-9._~+/=-]*[0-9+/=])[A-Za-z0-9._~+/=-]{12,}")

_PEM = re.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,20}-----"
                  r"(?:[A-Za-z0-9+/=\s:,.()-]|\\[nrt])*")
_URL_CREDENTIALS = re.compile(r"://[^\s:/@\"'\\]{0,200}:(?P<s>[^\s/\"'\\]{1,200})@")

#: names of the built-in rules, for documentation and tests
CATALOGUE: tuple[str, ...] = (*(name for name, _ in _TOKEN_RULES), "pem_private_key",
                              "url_credentials", "authorization_scheme", "sensitive_assignment",
                              "sensitive_attribute_key")

#: characters that cannot be part of a secret value: whitespace, quotes, the JSON escape char
_VALUE = r"[^\s\"'\\,;&<>{}\[\]`|]"

_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_MAX_KEY = 64
_SCHEME = r"(?:(?i:bearer|basic|token|digest|negotiate|apikey)\s+)?"
#: after a quoted name ("api_key": "...", \"password\": \"...\"): the value must be quoted too,
#: so a JSON number or null is never replaced by a string (the JSON stays valid)
_QUOTED_VALUE = re.compile(r"\s*\\?[\"']" + _SCHEME + r"(?P<s>" + _VALUE + r"{1,500})")
_PLAIN_VALUE = re.compile(r"\s*\\?[\"']?" + _SCHEME + r"(?P<s>" + _VALUE + r"{1,500})")
_FLAG_ASSIGN = re.compile(r"(?:\s*=\s*|\s+)\\?[\"']?(?P<s>" + _VALUE + r"{1,500})")

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPES = frozenset("nrtbf")


def _boundary_ok(text: str, pos: int) -> bool:
    if pos == 0:
        return True
    before = text[pos - 1]
    if not before.isalnum():
        return True
    # a JSON escape such as \n right before the secret: "line\nsk-..."
    return before in _ESCAPES and pos >= 2 and text[pos - 2] == "\\"


class _Finder:
    """Collects the spans to replace in one string."""

    __slots__ = ("ascii", "spans", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # one byte per character (non-ASCII -> "?"), so byte offsets are character offsets
        self.ascii = text.encode("ascii", "replace")
        self.spans: list[tuple[int, int]] = []

    def runs(self) -> None:
        """Shaped secrets (keys, tokens, JWTs) and Bearer/Basic values, inside long runs."""
        text = self.text
        if len(text) < _RUN_MIN:
            return
        mask = self.ascii.translate(_RUN_MASK)
        pos = mask.find(_RUN)
        while pos != -1:
            end = mask.find(b" ", pos)
            if end == -1:
                end = len(mask)
            for match in _TOKEN.finditer(text, pos, end):
                if match.lastgroup not in _NEEDS_BOUNDARY or _boundary_ok(text, match.start()):
                    self.spans.append(match.span())
            if _SCHEME_BEFORE.search(text, max(0, pos - 12), pos) is not None:
                value = _SCHEME_VALUE.match(text, pos, end)
                if value is not None:
                    self.spans.append(value.span())
            pos = mask.find(_RUN, end)

    def anchored(self) -> None:
        """PEM private key blocks and credentials in URLs."""
        text = self.text
        pos = text.find("-----BEGIN")
        while pos != -1:
            match = _PEM.match(text, pos)
            if match is not None:
                self.spans.append(match.span())
            pos = text.find("-----BEGIN", match.end() if match is not None else pos + 10)
        pos = text.find("://")
        while pos != -1:
            match = _URL_CREDENTIALS.match(text, pos)
            if match is not None:
                self.spans.append(match.span("s"))
            pos = text.find("://", pos + 3)

    def assignments(self) -> None:
        """``name = value`` / ``"name": "value"`` / ``--name value`` with a sensitive name.

        Visits each ``:`` and ``=`` (and each ``--``): the name right before it is checked with
        ``is_sensitive_key``, so the cost follows the number of separators, not of keywords.
        """
        text = self.text
        for sep in (":", "="):
            pos = text.find(sep)
            while pos != -1:
                self._assignment_at(pos)
                pos = text.find(sep, pos + 1)
        pos = text.find("--")
        while pos != -1:
            end = pos + 2
            ceiling = min(len(text), end + _MAX_KEY)
            while end < ceiling and text[end] in _KEY_CHARS:
                end += 1
            if end > pos + 2 and _boundary_ok(text, pos) and is_sensitive_key(text[pos:end]):
                match = _FLAG_ASSIGN.match(text, end)
                if match is not None:
                    self.spans.append(match.span("s"))
            pos = text.find("--", max(end, pos + 2))

    def _assignment_at(self, sep: int) -> None:
        text = self.text
        end = sep
        floor = max(0, sep - 8)
        while end > floor and text[end - 1] in " \t":
            end -= 1
        quoted = end > 0 and text[end - 1] in "\"'"
        if quoted:
            end -= 1
            if end > 0 and text[end - 1] == "\\":
                end -= 1
        start = end
        floor = max(0, end - _MAX_KEY)
        while start > floor and text[start - 1] in _KEY_CHARS:
            start -= 1
        if start == end or not is_sensitive_key(text[start:end]):
            return
        if quoted and not (start > 0 and text[start - 1] in "\"'"):
            return  # the quote closed a value, not a name ("a": "x", "b" ...)
        match = (_QUOTED_VALUE if quoted else _PLAIN_VALUE).match(text, sep + 1)
        if match is not None:
            self.spans.append(match.span("s"))

    def extra(self, patterns: Sequence[re.Pattern[str]]) -> None:
        for pattern in patterns:
            for match in pattern.finditer(self.text):
                if match.end() > match.start():
                    self.spans.append(match.span())

    def result(self) -> tuple[str, int]:
        if not self.spans:
            return self.text, 0
        self.spans.sort()
        parts: list[str] = []
        last = 0
        count = 0
        for start, end in self.spans:
            if end <= last:
                continue
            if start < last:  # overlapping spans merge into one redaction
                start = last
            else:
                count += 1
            parts.append(self.text[last:start])
            parts.append(REDACTED)
            last = end
        parts.append(self.text[last:])
        # merged neighbours produce "[REDACTED][REDACTED]": keep one
        return "".join(parts).replace(REDACTED + REDACTED, REDACTED), count


def fix_surrogates(text: str) -> str:
    """Replace lone surrogates (which no UTF-8 encoder accepts) with U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def scrub(text: str, extra: Sequence[re.Pattern[str]] = ()) -> tuple[str, int]:
    """Redact every secret of the catalogue (and ``extra`` patterns) in ``text``.

    Returns:
        The text (the same object when nothing matched) and the number of redactions.
    """
    if type(text) is not str:
        text = str.__str__(text)
    text = fix_surrogates(text)
    if len(text) < 5:
        return text, 0
    finder = _Finder(text)
    finder.runs()
    finder.anchored()
    finder.assignments()
    if extra:
        finder.extra(extra)
    return finder.result()


def compile_patterns(patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """Compile user patterns (``redact_patterns``); raises ``re.error`` for an invalid one."""
    return tuple(re.compile(p) for p in patterns)


# --- spans ---------------------------------------------------------------------------------------


class Scrubber:
    """The span-end redaction pass (see the module docstring). Thread-safe, never raises.

    Args:
        extra_patterns: more regular expressions whose matches are redacted.
    """

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        self.extra = compile_patterns(extra_patterns)
        self._resources: dict[int, tuple[Resource, Resource, int]] = {}

    def text(self, text: str) -> tuple[str, int]:
        """One string through the catalogue (and the extra patterns)."""
        return scrub(text, self.extra)

    def value(self, key: str | None, value: Any) -> tuple[Any, int]:
        """An attribute value (str, number, bool, bytes or a sequence of them)."""
        if key is not None and is_sensitive_key(key):
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                return (value, 0) if value == REDACTED or value is None else (REDACTED, 1)
            return [REDACTED] * len(value), len(value)
        kind = type(value)
        if kind is str:
            return self.text(value)
        if kind is bool or kind is int or kind is float or value is None:
            return value, 0
        if kind is bytes:
            text, count = self.text(value.decode("utf-8", "replace"))
            return (text.encode("utf-8"), count) if count else (value, 0)
        if isinstance(value, Sequence):
            items = []
            total = 0
            for item in value:
                new, count = self.value(None, item)
                items.append(new)
                total += count
            return (tuple(items), total) if total else (value, 0)
        if isinstance(value, Mapping):  # AnyValue maps (newer SDKs)
            return self.attributes(value)
        return value, 0

    def attributes(self, attrs: Mapping[str, Any] | None) -> tuple[Any, int]:
        """Scrub keys and values; returns the same mapping when nothing changed."""
        if not attrs:
            return attrs, 0
        out: dict[str, Any] | None = None
        total = 0
        for key, value in attrs.items():
            new_key, key_count = self.text(key) if type(key) is str else (key, 0)
            new_value, count = self.value(key, value)
            if key_count or count or new_key is not key or new_value is not value:
                if out is None:
                    out = dict(attrs)
                if new_key is not key:
                    out.pop(key, None)
                out[new_key] = new_value
                total += key_count + count
        return (attrs, 0) if out is None else (out, total)

    def resource(self, resource: Resource | None) -> tuple[Resource | None, int]:
        if resource is None:
            return None, 0
        cached = self._resources.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1], cached[2]
        attrs, count = self.attributes(resource.attributes)
        scrubbed = resource if not count and attrs is resource.attributes else \
            Resource(attrs, resource.schema_url)
        if len(self._resources) > 64:
            self._resources.clear()
        self._resources[id(resource)] = (resource, scrubbed, count)
        return scrubbed, count

    def __call__(self, span: ReadableSpan) -> ReadableSpan:
        """A scrubbed copy of ``span`` (the same object when nothing needed redaction)."""
        try:
            return self._scrub_span(span)
        except Exception:  # never lose a span to the scrubber: drop what could not be checked
            return _stripped(span)

    def _scrub_span(self, span: ReadableSpan) -> ReadableSpan:
        total = 0
        name, count = self.text(span.name)
        total += count
        changed = name is not span.name
        original = span.attributes  # a new read-only view on every access: read it once
        attrs, count = self.attributes(original)
        total += count
        changed = changed or attrs is not original
        events: list[Event] = []
        events_changed = False
        for event in span.events:
            event_name, name_count = self.text(event.name)
            before = event.attributes
            event_attrs, attr_count = self.attributes(before)
            if event_name is not event.name or event_attrs is not before:
                events_changed = True
                total += name_count + attr_count
                event = Event(event_name, event_attrs, event.timestamp)
            events.append(event)
        links: list[Link] = []
        links_changed = False
        for link in span.links:
            before = link.attributes
            link_attrs, count = self.attributes(before)
            if link_attrs is not before:
                links_changed = True
                total += count
                link = Link(link.context, link_attrs)
            links.append(link)
        status = span.status
        if status.description:
            description, count = self.text(status.description)
            if description is not status.description:
                total += count
                status = Status(status.status_code, description)
        resource, count = self.resource(span.resource)
        total += count
        if not (changed or events_changed or links_changed or status is not span.status
                or resource is not span.resource):
            return span
        new_attrs = dict(attrs or {})
        if total:
            previous = new_attrs.get(REDACTED_COUNT_KEY, 0)
            new_attrs[REDACTED_COUNT_KEY] = (previous if type(previous) is int else 0) + total
        return _copy(span, name=name, attributes=new_attrs,
                     events=events if events_changed else span.events,
                     links=links if links_changed else span.links,
                     status=status, resource=resource)


def _copy(span: ReadableSpan, **changes: Any) -> ReadableSpan:
    fields: dict[str, Any] = {
        "name": span.name, "context": span.context, "parent": span.parent,
        "resource": span.resource, "attributes": span.attributes, "events": span.events,
        "links": span.links, "kind": span.kind, "status": span.status,
        "start_time": span.start_time, "end_time": span.end_time,
        "instrumentation_scope": span.instrumentation_scope,
    }
    fields.update(changes)
    return ReadableSpan(**fields)


def _stripped(span: ReadableSpan) -> ReadableSpan:
    """Last resort when scrubbing failed: the span's identity and timing, no text content."""
    return _copy(span, name="[unscrubbable span]", attributes={"otel_verl.scrub_error": True},
                 events=(), links=(), status=Status(span.status.status_code))


def build_scrubber(config: Any) -> Scrubber | None:
    """The scrubber for a ``TraceConfig`` (None when ``redact`` is off)."""
    if not getattr(config, "redact", True):
        return None
    return Scrubber(getattr(config, "redact_patterns", ()) or ())


class ScrubbingSpanExporter(SpanExporter):
    """Runs a span transform (the scrubber) on every span before the wrapped exporter sees it.

    Wraps the backend's exporter inside the batch processor, so the pass runs on the export
    thread, before anything is written to disk or sent.
    """

    def __init__(self, exporter: SpanExporter,
                 transform: Callable[[ReadableSpan], ReadableSpan]) -> None:
        self.exporter = exporter
        self.transform = transform

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([self.transform(span) for span in spans])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self.exporter, "force_flush", None)
        return bool(flush(timeout_millis)) if callable(flush) else True

    def __getattr__(self, name: str) -> Any:  # stats() and other extras of the wrapped one
        return getattr(self.exporter, name)
