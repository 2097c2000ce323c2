"""Shared state of the verl integration: what is installed, what to undo, small safe helpers.

Each patched surface has its own module (``_facade``, ``_agent_loop``, ``_tools``, ``_vllm``); they
all record their changes here (``set_attr``), so ``uninstall()`` undoes every one of them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

from opentelemetry import trace as otel_trace

from otel_verl import _errors

_log = logging.getLogger("otel_verl")

#: the verl versions this integration is tested with (a pip requirement specifier)
SUPPORTED_VERL = "verl >= 0.9.1, < 0.10"
SUPPORTED_RANGE = ((0, 9, 1), (0, 10))

#: marks functions and classes otel_verl produced or already patched
MARK = "__otel_verl_verl__"


class State:
    """Process-wide patch state (one per process, guarded by ``LOCK``)."""

    def __init__(self) -> None:
        self.installed = False
        self.upstream_active = False  # verl's own mlflow / trackio backend in use
        self.sampler_patched = False  # AgentLoopWorker.generate_sequences applies our sampler
        self.originals: dict[str, Any] = {}  # verl's RolloutTraceConfig, rollout_trace_attr/_op
        self.wrapper_codes: frozenset[CodeType] = frozenset()  # code of verl's op wrapper
        self.undo: list[Callable[[], None]] = []
        self.warned: set[str] = set()  # one warning per unsupported surface and process

    def active(self) -> bool:
        """True when verl's tracing goes through otel_verl."""
        return self.installed and not self.upstream_active


S = State()
LOCK = threading.RLock()


def norm(value: Any) -> Any:
    """numpy/torch scalars (and tensordict's ``NonTensorData``, as verl's v1 trainer hands them
    over) -> Python scalars, so ranks and set membership agree with plain ints."""
    if type(value).__module__.split(".")[0] == "tensordict" and hasattr(value, "data"):
        value = value.data
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__.split(".")[0] in ("numpy", "torch"):
        try:
            return item()
        except Exception:
            return value
    return value


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    with LOCK:
        if key in S.warned:
            return
        S.warned.add(key)
    _log.warning(message, *args)


def release(version: str) -> tuple[int, ...]:
    """``"0.9.1.post2"`` -> ``(0, 9, 1)``: the leading numeric release segments."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def check_verl_version(version: str | None) -> bool:
    """True for a verl version in ``SUPPORTED_VERL``; otherwise one warning that says what is
    not traced (the surfaces whose shape differs each log their own line when they are met)."""
    low, high = SUPPORTED_RANGE
    if version is not None and low <= release(version) < high:
        return True
    warn_once("verl-version",
              "otel_verl: verl %s is not a version this integration is tested with (%s): "
              "rollouts are traced only where verl's agent-loop worker, tools and LLM client "
              "have verl 0.9's shape; otel_verl logs a warning for each part it cannot patch, "
              "and rollouts of a trainer it does not know (other than the legacy trainer and "
              "the v1 trainer's AgentLoopWorkerTQ) are not traced", version or "(unknown)",
              SUPPORTED_VERL)
    return False


def current_span() -> Any:
    """The current span if it records, else None."""
    span = otel_trace.get_current_span()
    return span if span.is_recording() else None


def safe(where: str, fn: Callable[[], None]) -> None:
    """Run ``fn``; an exception is reported as otel_verl's own error, never raised."""
    try:
        fn()
    except Exception as exc:
        _errors.internal_error(exc, where)


def set_attr(owner: Any, name: str, value: Any) -> None:
    """``setattr`` with its undo recorded."""
    missing = object()
    old = owner.__dict__.get(name, missing) if isinstance(owner, type) else getattr(
        owner, name, missing)
    setattr(owner, name, value)

    def undo() -> None:
        if old is missing:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, old)

    S.undo.append(undo)


def subclasses(cls: type) -> Iterator[type]:
    """Every subclass of ``cls``, direct or not."""
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def for_each_subclass(base: Any, callback: Callable[[type], None], where: str) -> None:
    """``callback(cls)`` for every subclass of ``base`` that exists now, and (through a
    ``base.__init_subclass__`` hook, undone by ``uninstall()``) for every one defined while
    installed; a callback that raises is reported as ``where``, never raised."""
    for sub in subclasses(base):
        callback(sub)

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        super(base, cls).__init_subclass__(**kwargs)
        if S.installed:
            safe(where, lambda: callback(cls))

    set_attr(base, "__init_subclass__", classmethod(__init_subclass__))


def mark_installed() -> bool:
    """Returns False when already installed."""
    with LOCK:
        if S.installed:
            return False
        S.installed = True
        return True


def undo_all() -> None:
    with LOCK:
        while S.undo:
            undo = S.undo.pop()
            safe("uninstall", undo)
        S.installed = False
        S.upstream_active = False
        S.sampler_patched = False
        S.warned.clear()


def is_installed() -> bool:
    return S.installed
