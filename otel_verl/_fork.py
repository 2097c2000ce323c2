"""One after-fork hook for the whole package.

A forked child inherits the parent's queues, locks held by threads that do not exist in it and
open log streams; each stage that holds such state registers here how to start the child empty.
One ``os.register_at_fork(after_in_child=...)`` runs the callbacks in registration order (the
modules' import order); one that raises is reported through ``_errors.internal_error`` and the
others still run. Nothing runs before a fork or in the parent: ``os.fork()`` waits for nothing.

Usage::

    _LIVE: LiveInstances[Thing] = LiveInstances("thing", Thing._after_fork_in_child)
    ...
    _LIVE.add(self)  # in Thing.__init__; the registry keeps a weak reference only

    register_after_in_child(_reseed, "the id generator")  # process-wide state
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from otel_verl import _errors

_T = TypeVar("_T")

_CALLBACKS: list[tuple[Callable[[], None], str]] = []


def register_after_in_child(callback: Callable[[], None], what: str) -> None:
    """Run ``callback()`` in every child forked after this call, after the callbacks registered
    before it. ``what`` names the state it resets (in the error report)."""
    _CALLBACKS.append((callback, what))


def _run_after_in_child() -> None:
    """The one ``after_in_child`` hook. In strict mode (tests) the first error is re-raised once
    all callbacks have run."""
    first: BaseException | None = None
    for callback, what in list(_CALLBACKS):
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - one stage's failure must not stop the others
            try:
                _errors.internal_error(exc, f"resetting {what} in a forked child")
            except Exception as strict:  # noqa: BLE001 - strict mode: raise after the others ran
                first = first or strict
    if first is not None:
        raise first


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_after_in_child)


class LiveInstances(Generic[_T]):
    """The live instances of one class, held weakly, each reset in a forked child by
    ``reset(instance)``; one that raises does not stop the rest (the first error is reported)."""

    def __init__(self, what: str, reset: Callable[[_T], None]) -> None:
        self._live: weakref.WeakSet[_T] = weakref.WeakSet()
        self._what = what
        self._reset = reset
        register_after_in_child(self._after_in_child, what)

    def add(self, instance: _T) -> None:
        self._live.add(instance)

    def __iter__(self) -> Iterator[_T]:
        """A snapshot: instances added or collected meanwhile do not disturb the loop."""
        return iter(list(self._live))

    def __len__(self) -> int:
        return len(self._live)

    def _after_in_child(self) -> None:
        first: BaseException | None = None
        for instance in self:
            try:
                self._reset(instance)
            except Exception as exc:  # noqa: BLE001 - the next instance still starts empty
                first = first or exc
        if first is not None:
            raise first
