"""The one guard for otel_verl's own bugs: log and continue in production, re-raise under tests.

Tracing must never break the rollout, but a test suite must see our bugs. ``otel_verl.testing``
turns on strict mode (a fixture, not environment sniffing).
"""

from __future__ import annotations

import logging
import time

_log = logging.getLogger("otel_verl")
_strict = False
_last_logged: dict[str, float] = {}


def set_strict(strict: bool) -> bool:
    """Re-raise internal errors (tests) or only log them (production). Returns the old setting."""
    global _strict
    old, _strict = _strict, strict
    return old


def internal_error(exc: BaseException, where: str) -> None:
    """Report an exception raised inside otel_verl itself (never one of the user's).

    Logs at most once a minute per place; re-raises in strict mode.
    """
    if _strict:
        raise exc
    now = time.monotonic()
    if now - _last_logged.get(where, -1e9) > 60.0:
        _last_logged[where] = now
        _log.warning("otel_verl internal error (%s): %s: %s; tracing continues", where,
                     type(exc).__name__, exc, exc_info=exc)
