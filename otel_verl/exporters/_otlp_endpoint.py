"""OTLP endpoints: the signal path joined in the right place, and credentials kept out of logs.

An endpoint may carry credentials: ``user:password@`` (userinfo), ``?api_key=...`` (query
values) or a key as a path segment (``/sk-.../v1/traces``, as some hosted collectors issue).
The exporter needs them to deliver, but nothing else may show them: :func:`redact_url` is the
form that may name an endpoint anywhere (a log line, a folder), and :func:`install_log_filter`
puts a :class:`CredentialLogFilter` on the OTLP exporter libraries' loggers (and on otel_verl's
and urllib3's, for the exact credentials of the configured endpoints), so their "Transient error
... url: ..." lines show the redacted form too.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable

#: what a credential becomes in a redacted endpoint or log line
MASK = "***"
#: the signal path of OTLP/HTTP traces
TRACES_PATH = "/v1/traces"
#: endpoint environment variables the OTLP exporters read when no endpoint is given
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: the libraries' loggers whose lines name the endpoint (checked against the installed
#: opentelemetry-exporter-otlp-proto-http/-grpc 1.45: the HTTP client logs through its trace
#: exporter's logger); urllib3 logs request lines (path and query) at DEBUG
#: (a filter sees only the records of its own logger, not of its children, so each is named)
LIBRARY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)
#: loggers shared with the application (urllib3's request lines) and our own: only the exact
#: secrets of the configured endpoints are replaced there
SHARED_LOGGERS = ("urllib3.connectionpool", "otel_verl", "otel_verl.exporters._file_exporter",
                  "otel_weave_exporter")

_KEY_PREFIX = re.compile(r"(?i)^(?:sk|pk|rk|ak|ghp|gho|ghs|glpat|xox[abprs]|hf|key|api|token)[-_]")
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,15}://[^\s'\"<>()\[\]{},]+")
_QUERY_VALUE = re.compile(r"([?&][^=&#\s'\"<>()]{1,100}=)[^&#\s'\"<>()]+")
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]{0,15}://)[^/?#@\s'\"<>]*@")


def _token_like(segment: str) -> bool:
    """A path segment that looks like a key: a known key prefix, or 16+ characters mixing
    letters and digits (version words like ``v1`` and names like ``traces`` are not)."""
    if len(segment) >= 8 and _KEY_PREFIX.match(segment):
        return True
    return (len(segment) >= 16 and any(c.isdigit() for c in segment)
            and any(c.isalpha() for c in segment))


def join_signal_path(endpoint: str, path: str = TRACES_PATH) -> str:
    """``endpoint`` with ``path`` appended to its URL path (not after its query string), unless
    the path already ends with it. ``http://h:4318/?k=v`` -> ``http://h:4318/v1/traces?k=v``."""
    parts = urllib.parse.urlsplit(endpoint)
    base = parts.path.rstrip("/")
    if not base.endswith(path):
        base += path
    return urllib.parse.urlunsplit(parts._replace(path=base))


def split_userinfo(endpoint: str) -> tuple[str, str | None, str | None]:
    """(endpoint without ``user:password@``, user, password); the user and password are
    percent-decoded, None when absent."""
    parts = urllib.parse.urlsplit(endpoint)
    if "@" not in parts.netloc:
        return endpoint, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return (urllib.parse.urlunsplit(parts._replace(netloc=hostport)),
            urllib.parse.unquote(user), urllib.parse.unquote(password) if colon else None)


def basic_auth_header(user: str, password: str | None) -> str:
    """The ``authorization`` value that ``user:password@`` means over HTTP."""
    raw = f"{user}:{password or ''}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def redact_url(url: str) -> str:
    """``url`` with its userinfo, every query value and token-like path segments replaced by
    ``***``: the form that may appear in a log line or a name. Idempotent."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    path = "/".join(MASK if _token_like(urllib.parse.unquote(s)) else s
                    for s in parts.path.split("/"))
    query = _QUERY_VALUE.sub(lambda m: m.group(1) + MASK, "?" + parts.query)[1:] \
        if parts.query else ""
    fragment = MASK if parts.fragment else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, query, fragment))


def url_secrets(url: str) -> set[str]:
    """The credential substrings of ``url`` (userinfo, query values, token-like path
    segments), raw and percent-decoded, for exact replacement in log lines."""
    found: set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return {url} if url else found
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found.add(userinfo)
        found.update(p for p in userinfo.split(":") if p)
    for segment in parts.path.split("/"):
        if _token_like(urllib.parse.unquote(segment)):
            found.add(segment)
    for match in _QUERY_VALUE.finditer("?" + parts.query):
        found.add(match.group(0)[len(match.group(1)):])
    if parts.fragment:
        found.add(parts.fragment)
    found |= {urllib.parse.unquote(s) for s in found} | {urllib.parse.quote(s) for s in found}
    # a short value ("a", "1") would mangle unrelated text; such values are no credential
    return {s for s in found if len(s) >= 4 and s != MASK}


def redact_text(text: str, secrets: Iterable[str] = (), urls: bool = True) -> str:
    """``text`` with the exact ``secrets`` replaced and, when ``urls``, every URL in it
    redacted (:func:`redact_url`) and query values after any ``?``/``&`` masked."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    if urls and ("://" in text or "=" in text):
        text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
        text = _QUERY_VALUE.sub(lambda m: m.group(1) + MASK, text)
    return text


class CredentialLogFilter(logging.Filter):
    """Rewrites a record's message (and its formatted exception) with credentials redacted.

    ``urls=True`` (library loggers): every URL, query value and known secret is redacted;
    ``urls=False`` (our own and shared loggers): only the known secrets of the configured
    endpoints. Never drops a record; a record already rewritten is left as it is.
    """

    _secrets: frozenset[str] = frozenset()
    _ordered: tuple[str, ...] = ()  # longest first: a secret inside another is not cut first
    _lock = threading.Lock()

    def __init__(self, urls: bool) -> None:
        super().__init__()
        self.urls = urls

    @classmethod
    def add_secrets(cls, secrets: Iterable[str]) -> None:
        with cls._lock:
            cls._secrets = frozenset(cls._secrets | set(secrets))
            cls._ordered = tuple(sorted(cls._secrets, key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_otel_verl_redacted", False):
            return True
        secrets = self._ordered
        if not secrets and not self.urls:
            return True
        try:
            message = record.getMessage()
            redacted = redact_text(message, secrets, self.urls)
            if redacted != message:
                record.msg, record.args = redacted, None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact_text(record.exc_text, secrets, self.urls)
            if record.stack_info:
                record.stack_info = redact_text(record.stack_info, secrets, self.urls)
            setattr(record, "_otel_verl_redacted", True)  # noqa: B010
        except Exception:  # noqa: BLE001  # a filter must never break logging
            record.msg, record.args = f"{record.levelname} from {record.name} (redacted)", None
        return True


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install_log_filter(endpoints: Iterable[str | None] = ()) -> None:
    """Remember the credentials of ``endpoints`` (and of the OTLP endpoint environment
    variables) and, the first time, put the filter on the library loggers and ours."""
    global _INSTALLED
    candidates = [e for e in endpoints if e] + [os.environ.get(v) or "" for v in ENDPOINT_ENV]
    CredentialLogFilter.add_secrets(s for e in candidates if e for s in url_secrets(e))
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).addFilter(CredentialLogFilter(urls=True))
        for name in SHARED_LOGGERS:
            logging.getLogger(name).addFilter(CredentialLogFilter(urls=False))
