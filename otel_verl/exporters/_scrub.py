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

User patterns run after the built-in rules, on their output, within a time budget per span
(``Scrubber(budget_s=...)``, 1 s by default): with the optional ``regex`` module each runs with
a timeout; without it, patterns that can backtrack without bound (``(a+)+$``) are refused with a
warning. A string a pattern could not be run on is exported as ``[REDACTED]`` whole and counted
(``Scrubber.stats()``): never unchecked. Strings of 4096 characters or more are remembered once
scrubbed (a bounded cache keyed by the string), so the same prompt on every turn is scanned once;
shorter ones are remembered in an LRU, and ids no rule can match (lowercase hex other than the 40
of a W&B key, otel_verl's ``tok:sha256:`` content ids) pass by one ``fullmatch`` (``_CLEAN_ID``).

Cost: linear in bytes, at C speed on any content (base64, hex, repeated characters, prose: see
the cost model above ``_TOKEN_RULES`` and ``bench/bench_scrub.py``). No rule is tried at every
position: each starts at a literal anchor found with ``bytes.find`` or at a candidate found in a
byte translation, and every match either fails within a bounded number of characters or the scan
goes on after it. The text stays valid JSON when it was JSON: no rule matches a quote or half an
escape sequence, and the replacement contains neither. Lone surrogates (unencodable in UTF-8)
become U+FFFD on the way.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

try:  # user patterns with a time limit (``pip install otel-verl[regex]``); see _UserPatterns
    import regex as _regex
except ImportError:  # pragma: no cover - depends on the environment
    _regex = None

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

from otel_verl.exporters._spans import copy_span as _copy

# the parser behind ``re`` (to look at a pattern's structure): re._parser since 3.11
_sre_parser: Any = importlib.import_module("re._parser" if sys.version_info >= (3, 11)
                                           else "sre_parse")
_sre_constants: Any = importlib.import_module("re._constants" if sys.version_info >= (3, 11)
                                              else "sre_constants")

__all__ = [
    "CATALOGUE",
    "REDACTED",
    "Scrubber",
    "ScrubbingSpanExporter",
    "build_scrubber",
    "is_sensitive_key",
    "scrub",
]

_log = logging.getLogger("otel_verl")

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
    "session.id",  # OpenInference's conversation grouping (a trajectory id), not a credential
})


@functools.lru_cache(maxsize=8192)
def is_sensitive_key(key: str) -> bool:
    """True for names whose values must never leave the process (``api_key``, ``password``, ...).

    Token counts and ids (``max_tokens``, ``prompt_ids``, ``token_ids``, ``eos_token``) are not.
    """
    name = key.lower()
    tail = name.rsplit(".", 1)[-1]
    if tail in _SAFE_KEYS or name in _SAFE_KEYS:
        return False
    return _SENSITIVE_KEY.search(name) is not None


# --- the catalogue -------------------------------------------------------------------------------
#
# Cost model. Python's ``re`` costs tens of nanoseconds per position it tries, and it holds the
# GIL for the whole call: a rule tried at every position of a base64 image runs at ~2 MB/s. So no
# rule here is tried at every position. Each is started only where a literal anchor is, and the
# anchors are found by C loops over a one-byte-per-character copy of the text:
#   - a "gate" character (``-``, ``_``, ``:``, ``J``, ``z``) is looked for with ``bytes.find`` of
#     one byte (memchr, tens of GB/s); while its occurrences are few, each is checked in place;
#     once they are many, the anchors themselves are found with ``bytes.find`` (~1.5 GB/s each);
#   - the 40-hex W&B key and the AWS key id have no literal prefix: a byte translation maps their
#     characters to one letter, and ``bytes.find`` of 40 (20) such letters finds every candidate;
#   - ``Bearer``/``Basic`` values and ``name = value`` assignments are visited from the runs or
#     the separators while those are few, else from the keywords (``pass``, ``key``, ...).
# Every rule matched at an anchor either fails within a bounded number of characters or matches
# to the end of a run and the scan goes on after it, so the whole pass is linear in bytes.

#: secrets with a recognisable shape, matched at their anchors (``_ANCHORS``)
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
_RULE = {name: re.compile(regex) for name, regex in _TOKEN_RULES}
#: rules that need a left boundary (so "task-..." is not an "sk-" key)
_NEEDS_BOUNDARY = frozenset({"openai_anthropic", "stripe", "github", "huggingface", "slack",
                             "google", "aws_access_key_id"})

_PEM = re.compile(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,20}-----"
                  r"(?:[A-Za-z0-9+/=\s:,.()-]+|\\+[nrt])*")  # \\+: newlines escaped once or more
_URL_CREDENTIALS = re.compile(r"://[^\s:/@\"'\\]{0,200}:(?P<s>[^\s/\"'\\]{1,200})@")
_JWT_SEGMENT = re.compile(r"[A-Za-z0-9_-]*")

#: gate character -> (literal, where the gate is relative to the literal's start, rule);
#: the literal need not contain the gate ("xox" + a letter + "-")
_ANCHORS: dict[bytes, tuple[tuple[bytes, int, str], ...]] = {
    b"-": ((b"sk-", 2, "openai_anthropic"), (b"xapp-", 4, "slack"), (b"xox", 4, "slack"),
           (b"-----BEGIN", 0, "pem")),
    b"_": (*((p + b"_", 2, "stripe") for p in (b"sk_live", b"sk_test", b"rk_live", b"rk_test")),
           (b"whsec_", 5, "stripe"), *((b"gh" + c + b"_", 3, "github") for c in
                                       (b"p", b"o", b"u", b"s", b"r")),
           (b"github_pat_", 6, "github_fine_grained"), (b"hf_", 2, "huggingface")),
    b":": ((b"://", 0, "url_credentials"),),
    b"J": ((b"eyJ", 2, "jwt"),),  # only where the text has a "." at all
    b"z": ((b"AIza", 2, "google"),),
}

_HEX_MASK = bytes(ord("h") if chr(i) in "0123456789abcdef" else ord(" ") for i in range(256))
_HEX40 = b"h" * 40
_UPPER_MASK = bytes(ord("U") if chr(i) in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ" else ord(" ")
                    for i in range(256))
_UPPER20 = b"U" * 20

_RUN_MIN = 12
#: token characters -> "x", others -> " " (non-ASCII characters were already made "?")
_RUN_MASK = bytes(ord("x") if (chr(i).isascii() and (chr(i).isalnum() or chr(i) in "_-+/=."))
                  else ord(" ") for i in range(256))
_RUN = b"x" * _RUN_MIN
#: "Authorization: Bearer <run>": a scheme word right before a run makes the run a secret
_SCHEME_WORDS = (b"bearer", b"basic", b"token", b"digest", b"negotiate")
_SCHEME_BEFORE = re.compile(r"(?i:bearer|basic|token|digest|negotiate)\s+$")
_SCHEME_VALUE = re.compile(r"(?=[A-Za-z0-9._~+/=-]*[0-9+/=])[A-Za-z0-9._~+/=-]{12,}")
_SPACES = re.compile(r"\s+")

#: names of the built-in rules, for documentation and tests
CATALOGUE: tuple[str, ...] = (*(name for name, _ in _TOKEN_RULES), "pem_private_key",
                              "url_credentials", "authorization_scheme", "sensitive_assignment",
                              "sensitive_attribute_key")

#: characters that cannot be part of a secret value: whitespace, quotes, the JSON escape char
_VALUE = r"[^\s\"'\\,;&<>{}\[\]`|]"

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_NAME_MASK = bytes(ord("k") if (chr(i).isascii() and (chr(i).isalnum() or chr(i) in "_.-"))
                   else ord(" ") for i in range(256))
_MAX_KEY = 64
#: every sensitive name (``is_sensitive_key``) contains one of these (lower case)
_KEYWORDS = (b"pass", b"pwd", b"secret", b"credential", b"key", b"auth", b"cookie", b"session",
             b"jwt", b"token")
_SCHEME = r"(?:(?i:bearer|basic|token|digest|negotiate|apikey)\s+)?"
#: after a quoted name ("api_key": "...", \"password\": \"...\", \\\"token\\\": ...: JSON
#: serialised once or more): the value must be quoted too, so a JSON number or null is never
#: replaced by a string (the JSON stays valid)
_QUOTED_VALUE = re.compile(r"\s*\\*[\"']" + _SCHEME + r"(?P<s>" + _VALUE + r"{1,500})")
_PLAIN_VALUE = re.compile(r"\s*\\?[\"']?" + _SCHEME + r"(?P<s>" + _VALUE + r"{1,500})")
_SCHEME_WORD = re.compile(r"(?i:bearer|basic|token|digest|negotiate|apikey)\s")
_FLAG_ASSIGN = re.compile(r"(?:\s*=\s*|\s+)\\?[\"']?(?P<s>" + _VALUE + r"{1,500})")
#: backslashes before the quote that ends a name: one per level of JSON serialisation
_MAX_ESCAPES = 16

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


def _budget(n: int, per: int) -> int:
    """How many occurrences are visited one by one (in Python) before a C-speed scan takes over."""
    return 32 + n // per


def _check_byte(literal: bytes, offset: int) -> tuple[int, int]:
    """A byte of ``literal`` next to its gate: (where, relative to the gate, and its value)."""
    if 0 < offset <= len(literal):  # the byte before the gate ("sk-": "k")
        return -1, literal[offset - 1]
    if offset == 0:  # the gate starts the literal ("://": "/")
        return 1, literal[1]
    return -offset, literal[0]  # the literal ends before the gate ("xox" + a letter + "-")


def _gate_table(anchors: tuple[tuple[bytes, int, str], ...]
                ) -> tuple[tuple[int, dict[int, tuple[tuple[bytes, int, str], ...]]], ...]:
    """A gate's anchors by one byte each must have beside the gate: (relative position,
    {byte: the anchors it admits}), so an occurrence is checked against the few anchors it
    could start, not all of them."""
    table: dict[int, dict[int, list[tuple[bytes, int, str]]]] = {}
    for anchor in anchors:
        where, byte = _check_byte(anchor[0], anchor[1])
        table.setdefault(where, {}).setdefault(byte, []).append(anchor)
    return tuple((where, {byte: tuple(group) for byte, group in by_byte.items()})
                 for where, by_byte in table.items())


_GATE_TABLES = {gate: _gate_table(anchors) for gate, anchors in _ANCHORS.items()}


def _gated_starts(data: bytes, gate: bytes, anchors: tuple[tuple[bytes, int, str], ...]
                  ) -> list[tuple[int, bytes, str]] | None:
    """Where each anchor of ``gate`` starts in ``data`` (position, literal, rule), unsorted;
    None when the gate character is too frequent for a visit each."""
    found: list[tuple[int, bytes, str]] = []
    table = _GATE_TABLES.get(gate) if anchors is _ANCHORS.get(gate) else None
    if table is None:
        table = _gate_table(anchors)
    n = len(data)
    budget = _budget(n, 2048)
    pos = data.find(gate)
    while pos != -1:
        budget -= 1
        if budget < 0:
            return None
        for where, by_byte in table:
            at = pos + where
            if 0 <= at < n:
                candidates = by_byte.get(data[at])
                if candidates is not None:
                    for literal, offset, rule in candidates:
                        start = pos - offset
                        if start >= 0 and data.startswith(literal, start):
                            found.append((start, literal, rule))
        pos = data.find(gate, pos + 1)
    return found


def _runs(mask: bytes, run: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of ``mask`` (a byte mask: a space ends a run) that starts with
    ``run``, left to right."""
    n = len(mask)
    pos = mask.find(run)
    while pos != -1:
        end = mask.find(b" ", pos)
        if end == -1:
            end = n
        yield pos, end
        pos = mask.find(run, end)


#: the shortest secret of any prefixed rule: "xoxb-" and 10 characters
_TOKEN_MIN = b"x" * 15
_RUN20 = b"x" * 20
_RUN40 = b"x" * 40


class _Finder:
    """Collects the spans to replace in one string (see the cost model above)."""

    __slots__ = ("_lower", "_names", "_runs", "ascii", "spans", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # one byte per character (non-ASCII -> "?"), so byte offsets are character offsets
        self.ascii = text.encode("ascii", "replace")
        self.spans: list[tuple[int, int]] = []
        self._lower: bytes | None = None
        self._names: bytes | None = None
        self._runs: bytes | None = None

    def lower(self) -> bytes:
        if self._lower is None:
            self._lower = self.ascii.lower()
        return self._lower

    def names(self) -> bytes:
        if self._names is None:
            self._names = self.ascii.translate(_NAME_MASK)
        return self._names

    def runs_mask(self) -> bytes:
        if self._runs is None:
            self._runs = self.ascii.translate(_RUN_MASK)
        return self._runs

    # shaped secrets ------------------------------------------------------------------------------

    def anchored(self) -> None:
        """Prefixed keys and tokens, JWTs, PEM private key blocks, credentials in URLs."""
        data = self.ascii
        for gate, anchors in _ANCHORS.items():
            if gate == b"J" and data.find(b".") == -1:
                continue  # a JWT has dots
            starts = _gated_starts(data, gate, anchors)
            if starts is None:  # many gates: find each literal, jumping as each rule allows
                for literal, _, rule in anchors:
                    state = [0]
                    # a literal that starts with its gate is searched from its first other
                    # character: "-----BEGIN" as "BEGIN" (a run of dashes stalls the search)
                    skip = len(literal) - len(literal.lstrip(gate))
                    pos = data.find(literal[skip:], skip)
                    while pos != -1:
                        start = pos - skip
                        after = self._at(rule, start, state) if \
                            data.startswith(literal, start) else start + 1
                        pos = data.find(literal[skip:], max(after, start + 1) + skip)
            else:
                states: dict[bytes, list[int]] = {}
                resume: dict[bytes, int] = {}
                for start, literal, rule in sorted(starts):
                    if start >= resume.get(literal, 0):
                        resume[literal] = self._at(rule, start, states.setdefault(literal, [0]))

    def _at(self, rule: str, start: int, state: list[int]) -> int:
        """Match ``rule`` at its anchor ``start``; returns where the next anchor may be.

        ``state[0]``: the end of a match refused for its left boundary ("task-..."): an anchor
        before it matches to the same end, so only its own boundary is left to check.
        """
        text, data, spans = self.text, self.ascii, self.spans
        if rule == "pem":
            key = data.find(b"PRIVATE KEY", start + 10)
            if key == -1:
                return len(data)
            if key - start > 50:  # "-----BEGIN", up to 40 characters, "PRIVATE KEY"
                return key - 50
            match = _PEM.match(text, start)
            if match is None:
                return start + 10
            spans.append(match.span())
            return match.end()
        if rule == "url_credentials":
            at = data.find(b"@", start + 3)
            if at == -1:
                return len(data)
            if at - start > 404:  # "://", up to 200, ":", up to 200, "@"
                return at - 404
            match = _URL_CREDENTIALS.match(text, start)
            if match is not None:
                spans.append(match.span("s"))
            return start + 3
        runs = self.runs_mask()
        if not runs.startswith(_TOKEN_MIN, start):  # too short here: on to the next long run
            run = runs.find(_TOKEN_MIN, start + 1)
            return len(data) if run == -1 else run
        if start < state[0] and not _boundary_ok(text, start):
            return start + 1
        match = _RULE[rule].match(text, start)
        if rule == "jwt":
            # every "eyJ" up to the end of this first segment matches (or fails) to the same end;
            # one in the next segment may start a longer chain
            if match is not None:
                spans.append(match.span())
            return _JWT_SEGMENT.match(text, start + 3).end()  # type: ignore[union-attr]
        if match is None:
            return start + 1
        if rule not in _NEEDS_BOUNDARY or _boundary_ok(text, start):
            spans.append(match.span())
            return match.end()
        state[0] = match.end()
        return start + 1

    def unprefixed(self) -> None:
        """The 40-hex W&B key (optionally ``local-``) and AWS access key ids, from byte masks."""
        text, data, spans = self.text, self.ascii, self.spans
        runs = self.runs_mask()
        if runs.find(_RUN20) == -1:
            return  # both shapes are runs of 20+ token characters
        if runs.find(_RUN40) != -1:  # 40 hex characters are a run of 40+ token characters
            for pos, end in _runs(data.translate(_HEX_MASK), _HEX40):
                if end - pos == 40:
                    spans.append((pos - 6 if text.startswith("local-", pos - 6) else pos, end))
        for pos, _ in _runs(data.translate(_UPPER_MASK), _UPPER20):
            match = _RULE["aws_access_key_id"].match(text, pos)
            if match is not None and _boundary_ok(text, pos):
                spans.append(match.span())

    def schemes(self) -> None:
        """``Bearer``/``Basic``/``Token`` values: a scheme word, spaces, a run of 12+ characters."""
        text, spans = self.text, self.spans
        mask = self.runs_mask()
        n = len(mask)
        budget = _budget(n, 8192)
        for pos, end in _runs(mask, _RUN):  # from the runs, while they are few
            budget -= 1
            if budget < 0:
                break
            if pos > 0 and text[pos - 1].isspace() and \
                    _SCHEME_BEFORE.search(text, max(0, pos - 12), pos) is not None:
                value = _SCHEME_VALUE.match(text, pos, end)
                if value is not None:
                    spans.append(value.span())
        else:
            return
        lower = self.lower()  # many runs: from the scheme words instead
        for word in _SCHEME_WORDS:
            pos = lower.find(word)
            while pos != -1:
                after = pos + len(word)
                if after < n and text[after].isspace():
                    spaces = _SPACES.match(text, after)
                    start = spaces.end() if spaces is not None else after
                    if mask.startswith(_RUN, start):
                        end = mask.find(b" ", start)
                        value = _SCHEME_VALUE.match(text, start, n if end == -1 else end)
                        if value is not None:
                            spans.append(value.span())
                pos = lower.find(word, after)

    def assignments(self) -> None:
        """``name = value`` / ``"name": "value"`` / ``--name value`` with a sensitive name
        (:class:`_Assignments`)."""
        _Assignments(self).scan()

    def extra(self, patterns: Sequence[re.Pattern[str]]) -> None:
        for pattern in patterns:
            for match in pattern.finditer(self.text):
                if match.end() > match.start():
                    self.spans.append(match.span())

    def result(self) -> tuple[str, int]:
        if not self.spans:
            return self.text, 0
        return _apply(self.text, self.spans)


class _Assignments:
    """``name = value`` / ``"name": "value"`` / ``--name value`` with a sensitive name, in the
    string of one :class:`_Finder` (its text, masks and spans).

    While separators (``:``, ``=``, ``--``) are few, each is visited and the name right before it
    is checked with ``is_sensitive_key``; where they are many, each keyword a sensitive name must
    contain (``_KEYWORDS``) is found instead and its name checked.
    """

    __slots__ = ("ascii", "lower", "names", "spans", "text")

    def __init__(self, finder: _Finder) -> None:
        self.text = finder.text
        self.ascii = finder.ascii
        self.spans = finder.spans
        self.lower = finder.lower
        self.names = finder.names

    def scan(self) -> None:
        if not self._by_separators():
            self._by_keywords()

    def _value_after(self, sep: int, start: int, end: int, quoted: bool) -> int:
        """The value after a separator at ``sep``, when ``text[start:end]`` is a sensitive name.

        Returns where the value ends when it was shorter than the cap (a name inside it needs
        no visit: its own value ends there too), else -1.
        """
        text = self.text
        if start < end and is_sensitive_key(text[start:end]) and \
                (not quoted or (start > 0 and text[start - 1] in "\"'")):
            match = (_QUOTED_VALUE if quoted else _PLAIN_VALUE).match(text, sep + 1)
            if match is not None:
                value_start, value_end = match.span("s")
                self.spans.append((value_start, value_end))
                return value_end if value_end - value_start < 500 else -1
        return -1

    def _flag(self, pos: int, end: int) -> None:
        """``--name value`` where ``text[pos:end]`` is ``--name``."""
        text = self.text
        if end > pos + 2 and _boundary_ok(text, pos) and is_sensitive_key(text[pos:end]):
            match = _FLAG_ASSIGN.match(text, end)
            if match is not None:
                self.spans.append(match.span("s"))

    def _by_separators(self) -> bool:
        """False (and nothing done) when separators are too many for a visit each."""
        text, data = self.text, self.ascii
        n = len(data)
        budget = _budget(n, 128)  # ~1.5 us a visit; the keyword scan costs ~10 ms per MB
        if n > 1 << 17:  # estimate from the first 64 KiB rather than find out the slow way
            sample = sum(data.count(sep, 0, 1 << 16) for sep in (b":", b"=", b"--"))
            if sample * (n >> 16) > budget:
                return False
        seps: list[int] = []
        for sep in (b":", b"="):
            pos = data.find(sep)
            while pos != -1:
                seps.append(pos)
                if len(seps) > budget:
                    return False
                pos = data.find(sep, pos + 1)
        flags: list[int] = []
        if data.find(b"-") != -1:
            pos = data.find(b"--")
            while pos != -1:
                flags.append(pos)
                if len(flags) + len(seps) > budget:
                    return False
                pos = data.find(b"--", pos + 2)
        names = self.names() if len(seps) > n >> 9 else None
        for pos in seps:
            end = pos
            while end > 0 and pos - end < 8 and text[end - 1] in " \t":
                end -= 1
            quoted = end > 0 and text[end - 1] in "\"'"
            if quoted:
                end -= 1
                floor = max(0, end - _MAX_ESCAPES)
                while end > floor and text[end - 1] == "\\":
                    end -= 1
            floor = max(0, end - _MAX_KEY)
            if names is not None:
                start = names.rfind(b" ", floor, end) + 1 or floor
            else:
                start = end
                while start > floor and text[start - 1] in _NAME_CHARS:
                    start -= 1
            self._value_after(pos, start, end, quoted)
        last = -1
        for pos in flags:
            if pos < last:
                continue
            end = pos + 2
            ceiling = min(n, end + _MAX_KEY)
            while end < ceiling and text[end] in _NAME_CHARS:
                end += 1
            self._flag(pos, end)
            last = end
        return True

    def _by_keywords(self) -> None:
        text = self.text
        lower = self.lower()
        names = self.names()
        n = len(names)
        for keyword in _KEYWORDS:
            covered = -1  # the end of the last value redacted whole (shorter than the cap)
            pos = lower.find(keyword)
            while pos != -1:
                end = names.find(b" ", pos)
                if end == -1:
                    end = n
                start = names.rfind(b" ", 0, pos) + 1
                # name [separator]: backslashes and a quote, spaces, then ":" or "="
                after = end
                ceiling = min(n, end + _MAX_ESCAPES)
                while after < ceiling and text[after] == "\\":
                    after += 1
                quoted = after < n and text[after] in "\"'"
                if quoted:
                    after += 1
                elif after > end:
                    after = n  # backslashes without a quote: no assignment
                spaces = after
                while after < n and after - spaces < 8 and text[after] in " \t":
                    after += 1
                if after < n and text[after] in ":=":
                    if after + 1 < covered and _SCHEME_WORD.match(text, after + 1) is None:
                        # inside that value: its own value ends there too
                        pos = lower.find(keyword, end)
                        continue
                    covered = max(covered, self._value_after(after, max(start, end - _MAX_KEY),
                                                             end, quoted))
                flag = text.find("--", start, end)  # --name, anywhere in this name's run
                while flag != -1:
                    flag_end = min(end, flag + 2 + _MAX_KEY)
                    self._flag(flag, flag_end)
                    flag = text.find("--", max(flag_end, flag + 2), end)
                pos = lower.find(keyword, end)


def _apply(text: str, spans: list[tuple[int, int]]) -> tuple[str, int]:
    """``text`` with each span (merged where they overlap) replaced by ``REDACTED``."""
    spans.sort()
    parts: list[str] = []
    last = 0
    count = 0
    for start, end in spans:
        if end <= last:
            continue
        if start < last:  # overlapping spans merge into one redaction
            start = last
        else:
            count += 1
        parts.append(text[last:start])
        parts.append(REDACTED)
        last = end
    parts.append(text[last:])
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
    if len(text) < 5:
        return fix_surrogates(text), 0
    if len(text) <= _SHORT and not extra:  # names, kinds, ids: the same few values on every span
        out, count = _scrub_short(text)
        return (text, 0) if out is None else (out, count)
    if extra or len(text) < _CACHE_MIN:
        return _scrub(text, extra)
    hit = _CACHE.get(text)
    if hit is not None:
        return hit
    out, count = _scrub(text, ())
    _CACHE.put(text, out, count)
    return out, count


_SHORT = 256
#: strings at least this long are remembered once scrubbed (``_Cache``)
_CACHE_MIN = 4096


class _Cache:
    """What long strings scrubbed to, so that content seen again (the same prompt on every turn,
    a GRPO group's shared prompt) is not scanned again.

    Keyed by the string itself: the lookup is the string's own hash (computed once per string
    object, at C speed) and an exact comparison, so a collision can never return another string's
    result. Bounded in bytes (the strings held, input and output) and in entries, least recently
    used first out. Thread-safe and never blocking: when another thread holds the lock (or held
    it across a fork), the cache is skipped, not waited for.
    """

    def __init__(self, max_bytes: int = 32 << 20, max_entries: int = 512) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self.hits = 0
        self._entries: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[str, int] | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            entry = self._entries.get(text)
            if entry is None:
                return None
            self._entries.move_to_end(text)
            self.hits += 1
            return entry[0], entry[1]
        finally:
            self._lock.release()

    def put(self, text: str, out: str, count: int) -> None:
        size = sys.getsizeof(text) + (sys.getsizeof(out) if out is not text else 0)
        if size > self.max_bytes // 4 or not self._lock.acquire(blocking=False):
            return
        try:
            old = self._entries.pop(text, None)
            if old is not None:
                self.bytes -= old[2]
            self._entries[text] = (out, count, size)
            self.bytes += size
            while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
        finally:
            self._lock.release()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0


_CACHE = _Cache()


#: strings no rule of the catalogue can match: lowercase hex ids (but the 40 of a W&B key),
#: optionally ``-<number>`` (an engine's ``<request id>-<turn>``), and otel_verl's content ids
#: (``tok:sha256:<64 hex>``): no anchor, no upper case, no 40-hex run, no sensitive name
_CLEAN_ID = re.compile(r"(?:(?:tok|msg):sha256:)?(?:[0-9a-f]{1,39}|[0-9a-f]{41,256})"
                       r"(?:-[0-9]{1,9})?")


@functools.lru_cache(maxsize=4096)
def _scrub_short(text: str) -> tuple[str | None, int]:
    if _CLEAN_ID.fullmatch(text) is not None:
        return None, 0
    out, count = _scrub(text, ())
    return (None, 0) if out is text else (out, count)


def _scrub(text: str, extra: Sequence[re.Pattern[str]]) -> tuple[str, int]:
    text = fix_surrogates(text)
    finder = _Finder(text)
    finder.anchored()
    finder.unprefixed()
    finder.schemes()
    finder.assignments()
    if extra:
        finder.extra(extra)
    return finder.result()


def compile_patterns(patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """Compile user patterns (``redact_patterns``); raises ``re.error`` for an invalid one."""
    return tuple(re.compile(p) for p in patterns)


# --- user patterns, under a time budget ----------------------------------------------------------

#: the time one span's strings may spend in user patterns (``Scrubber(budget_s=...)``)
DEFAULT_BUDGET_S = 1.0
#: a pattern that overran its budget this many times is no longer run (fail closed)
_MAX_STRIKES = 3


def backtracks_catastrophically(pattern: str) -> bool:
    """True for a pattern whose backtracking can grow without bound with the input's length.

    The shapes that blow up in a backtracking engine: a repeat inside a repeat where the inner one
    has a variable length (``(a+)+``, ``(\\w+\\s?)*``, ``(a{1,3}){2,}``), a repeated alternation
    (``(a|aa)+``), and backreferences. Atomic groups and possessive repeats are not counted
    (they do not backtrack into their body). A pattern ``re`` cannot parse counts as one.
    """
    try:
        parsed = _sre_parser.parse(pattern)
    except Exception:
        return True
    c = _sre_constants
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT)

    def walk(items: Any, outer: bool) -> bool:
        for op, av in items:
            if op in repeats:
                low, high, body = av
                repeated = high is c.MAXREPEAT or high > 1
                if outer and low != high:
                    return True
                if walk(body, outer or repeated):
                    return True
            elif op is c.SUBPATTERN:
                if walk(av[-1], outer):
                    return True
            elif op is c.BRANCH:
                if outer or any(walk(branch, outer) for branch in av[1]):
                    return True
            elif op in (c.ASSERT, c.ASSERT_NOT):
                if walk(av[1], outer):
                    return True
            elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return True
        return False

    return walk(parsed, False)


class _UserPatterns:
    """``redact_patterns``, run so that none can freeze the process.

    Python's ``re`` cannot be interrupted and holds the GIL while it matches: one catastrophic
    pattern (``(a+)+$`` on a long run of ``a``) stops every thread for minutes, shutdown
    included. So:

    - with the ``regex`` module installed (``otel-verl[regex]``), each pattern runs under the
      time left in the span's budget (``timeout=``); a pattern that overran it
      ``_MAX_STRIKES`` times is not run again;
    - without it, the patterns run with ``re``, except those that
      ``backtracks_catastrophically`` finds: they are refused (a warning says which);
    - either way, a string a pattern could not be run on is not exported: it is replaced by
      ``[REDACTED]`` whole and counted (fail closed).
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.compiled: list[tuple[str, Any, bool]] = []  # (pattern, compiled, has a timeout)
        self.refused: list[str] = []
        self.strikes: dict[str, int] = {}
        self.lock = threading.Lock()
        for pattern in patterns:
            if _regex is not None:
                try:
                    self.compiled.append((pattern, _regex.compile(pattern), True))
                    continue
                except Exception:  # syntax regex reads differently: fall back to re
                    pass
            if backtracks_catastrophically(pattern):
                self.refused.append(pattern)
                _log.warning(
                    "redact_patterns: %r can backtrack without bound (nested or alternated "
                    "repeats), and without the regex module it cannot be given a time limit; it "
                    "is not run, and every string it would check is exported as [REDACTED]. "
                    "Install otel-verl[regex], or rewrite it", pattern)
            else:
                self.compiled.append((pattern, re.compile(pattern), False))

    def spans(self, text: str, deadline: float) -> list[tuple[int, int]] | None:
        """The spans to redact, or None when some pattern could not be run in time."""
        if self.refused:
            return None
        found: list[tuple[int, int]] = []
        for pattern, compiled, timed in self.compiled:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            began = time.monotonic()
            try:
                if timed:
                    matches = compiled.finditer(text, timeout=left)
                else:
                    matches = compiled.finditer(text)
                for n, match in enumerate(matches):
                    if match.end() > match.start():
                        found.append(match.span())
                    if n & 255 == 255 and time.monotonic() > deadline:
                        self._strike(pattern)
                        return None
            except TimeoutError:
                self._strike(pattern)
                return None
            if time.monotonic() - began > left:  # re: ran past its budget (cannot be stopped)
                self._strike(pattern)
                return None
        return found

    def _strike(self, pattern: str) -> None:
        """One more overrun for ``pattern``; at ``_MAX_STRIKES`` it is refused."""
        with self.lock:
            self.strikes[pattern] = self.strikes.get(pattern, 0) + 1
            if self.strikes[pattern] >= _MAX_STRIKES and pattern not in self.refused:
                self.refused.append(pattern)
                self.compiled = [entry for entry in self.compiled if entry[0] != pattern]
                _log.warning("redact_patterns: %r ran past its time budget %d times; it is no "
                             "longer run, and every string it would check is exported as "
                             "[REDACTED]", pattern, _MAX_STRIKES)


# --- spans ---------------------------------------------------------------------------------------


#: attribute keys remembered per scrubber (a process sets a few dozen; a bound for any use)
_MAX_KEYS = 4096


class Scrubber:
    """The span-end redaction pass (see the module docstring). Thread-safe, never raises.

    Args:
        extra_patterns: more regular expressions whose matches are redacted.
    """

    def __init__(self, extra_patterns: Iterable[str] = (),
                 budget_s: float = DEFAULT_BUDGET_S) -> None:
        patterns = tuple(extra_patterns)
        self.extra = compile_patterns(patterns)
        self.budget_s = budget_s
        self._user = _UserPatterns(patterns) if patterns else None
        self._cache = _Cache(16 << 20) if patterns else _CACHE
        self._local = threading.local()
        #: strings exported as [REDACTED] whole because a user pattern could not run in time
        self.failed_closed = 0
        self._resources: dict[int, tuple[Resource, Resource, int]] = {}
        #: attribute key -> (its scrubbed form or None when clean, redactions in it, is it a
        #: sensitive name): the same few keys on every span (built-in rules only: user
        #: patterns run under a time budget)
        self._keys: dict[str, tuple[str | None, int, bool]] | None = None if patterns else {}

    def stats(self) -> dict[str, int]:
        """Counters: strings failed closed, patterns refused, cache hits and bytes held."""
        return {"redact_failed_closed": self.failed_closed,
                "redact_patterns_refused": len(self._user.refused) if self._user else 0,
                "redact_cache_hits": self._cache.hits, "redact_cache_bytes": self._cache.bytes}

    def text(self, text: str) -> tuple[str, int]:
        """One string through the catalogue (and the extra patterns, within the span's budget)."""
        user = self._user
        if user is None:
            return scrub(text)
        if type(text) is not str:
            text = str.__str__(text)
        if len(text) < 5:
            return fix_surrogates(text), 0
        long = len(text) >= _CACHE_MIN
        if long:
            hit = self._cache.get(text)
            if hit is not None:
                return hit
        out, count = scrub(text)
        deadline = getattr(self._local, "deadline", None)
        spans = user.spans(out, deadline if deadline is not None
                           else time.monotonic() + self.budget_s)
        if spans is None:  # fail closed: never export what could not be checked
            self.failed_closed += 1
            return REDACTED, count + 1
        if spans:
            out, more = _apply(out, spans)
            count += more
        if long:
            self._cache.put(text, out, count)
        return out, count

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
        keys = self._keys
        out: dict[str, Any] | None = None
        total = 0
        for key, value in attrs.items():
            entry = keys.get(key) if keys is not None and type(key) is str else None
            if entry is not None:
                scrubbed_key, key_count, sensitive = entry
                new_key = key if scrubbed_key is None else scrubbed_key
                if type(value) is str and not sensitive:
                    new_value, count = scrub(value)
                else:
                    new_value, count = self.value(key, value)
            else:
                new_key, key_count = self.text(key) if type(key) is str else (key, 0)
                new_value, count = self.value(key, value)
                if keys is not None and type(key) is str:
                    if len(keys) >= _MAX_KEYS:
                        keys.clear()
                    keys[key] = (None if new_key is key else new_key, key_count,
                                 is_sensitive_key(key))
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
        self._local.deadline = time.monotonic() + self.budget_s
        try:
            return self._scrub_span(span)
        except Exception:  # never lose a span to the scrubber: drop what could not be checked
            return _stripped(span)
        finally:
            self._local.deadline = None

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
