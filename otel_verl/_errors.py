"""The one guard for otel_verl's own bugs: log and continue in production, re-raise under tests.

Tracing must never break the rollout, but a test suite must see our bugs. ``otel_verl.testing``
turns on strict mode (a fixture, not environment sniffing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

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


class RateLimitedWarning:
    """One kind of warning that can repeat for as long as a run: the first is logged, then at
    most one per ``interval_s``, saying how many were suppressed since the last line.

    ``logged`` and ``suppressed`` count the lines written and held back (for ``stats()``);
    ``summary()`` writes the count still held back (at shutdown), if any.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._held = 0  # suppressed since the last line
        self.logged = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    def warn(self, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless one was logged less than ``interval_s`` ago. True when
        logged."""
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                self._held += 1
                self.suppressed += 1
                return False
            held, self._held, self._last = self._held, 0, now
            self.logged += 1
        if held:
            msg += " (%d more like it in the last %.0fs were not logged)"
            args = (*args, held, self.interval_s)
        self._logger.warning(msg, *args, exc_info=exc_info)
        return True

    def summary(self, what: str) -> None:
        """Log how many warnings about ``what`` were held back since the last line, if any."""
        with self._lock:
            held, self._held = self._held, 0
        if held:
            self._logger.warning("otel_verl: %d more warning(s) not logged: %s", held, what)
