"""Ray helpers: work that a trajectory hands to Ray tasks and actors stays in the same trace.

A rollout's reward may be computed in a Ray task and its tools run by a Ray actor, in other
processes (and on other nodes). Three things make their spans join the driver's trajectory:

1. every worker process builds otel_verl's provider from the driver's configuration --
   :func:`runtime_env` puts ``RolloutTraceConfig.export_env()`` into Ray's ``runtime_env``;
2. a carrier (``otel_verl.inject_context()``: W3C ``traceparent`` + the trajectory attributes)
   travels with each call -- :func:`call_with_context` adds it as one extra keyword argument;
3. the worker side (:func:`traced_remote`) initialises tracing from the environment, runs the
   call inside ``otel_verl.use_context(carrier)`` and flushes before returning, so no span is
   lost when Ray kills idle workers at ``ray.shutdown()`` (atexit handlers do not reliably run
   there).

Usage::

    import ray
    from otel_verl import RolloutTraceConfig, SpanKindName, rollout_trace_attr, rollout_trace_op
    from otel_verl.integrations.ray import call_with_context, runtime_env, traced_remote

    RolloutTraceConfig.init("my_project", "exp1", backend="otlp")   # sidecar on localhost:4317
    ray.init(runtime_env=runtime_env())

    @ray.remote
    @traced_remote
    @rollout_trace_op(kind=SpanKindName.EVALUATOR)
    def compute_score(solution: str, ground_truth: str) -> float: ...

    @ray.remote
    @traced_remote                     # on a class: each public method (and __call__)
    class Sandbox:
        @rollout_trace_op(kind=SpanKindName.TOOL)
        def execute(self, code: str) -> str: ...

    sandbox = Sandbox.remote()
    with rollout_trace_attr(step=1, sample_index=3, rollout_n=0):
        out = ray.get(call_with_context(sandbox.execute, "print(1)"))
        score = ray.get(call_with_context(compute_score, out, "1"))

``traced_remote`` goes UNDER ``@ray.remote`` (it wraps the plain function/class). A call made
without a carrier (plain ``.remote(...)``) still works; its spans then start their own trace.
The wrappers are plain functions (Ray needs functions to find actor methods) and pickle with
Ray's cloudpickle. Generator functions/methods are not wrapped.

Configuration: nothing of its own; the worker uses the driver's ``TraceConfig``. For
``backend="file"`` the trace directory is made absolute, so workers write where the driver
does (on a multi-node cluster point it at shared storage, or use ``backend="otlp"`` with a
collector sidecar per node -- see docs/scale.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from otel_verl import RolloutTraceConfig, inject_context, use_context

__all__ = [
    "CARRIER_KWARG",
    "call_with_context",
    "carrier_kwargs",
    "runtime_env",
    "traced_remote",
]

#: the keyword argument that carries the trace context into a ``traced_remote`` function
CARRIER_KWARG = "_otel_verl_carrier"

T = TypeVar("T")


def runtime_env(base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` whose ``env_vars`` make workers trace like this (driver) process.

    Args:
        base: an existing runtime_env to extend (its ``env_vars`` are kept; ours win on clashes).

    Returns:
        A new dict for ``ray.init(runtime_env=...)`` or ``.options(runtime_env=...)``.
    """
    env = dict(base or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars.update(RolloutTraceConfig.export_env())  # directories already made absolute
    env["env_vars"] = env_vars
    return env


def carrier_kwargs() -> dict[str, dict[str, str]]:
    """``{CARRIER_KWARG: inject_context()}``, to splat into a ``.remote(...)`` call yourself."""
    return {CARRIER_KWARG: inject_context()}


def call_with_context(remote: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a ``traced_remote`` task or actor method with the current trace context.

    Args:
        remote: a remote function, an actor method (``actor.method``), something from
            ``.options(...)``, or their bound ``.remote``.
        *args, **kwargs: the call's own arguments.

    Returns:
        Whatever ``.remote(...)`` returns (an ``ObjectRef``).
    """
    submit = getattr(remote, "remote", remote)
    return submit(*args, **{CARRIER_KWARG: inject_context()}, **kwargs)


def traced_remote(obj: T | None = None, *, flush: bool = True,
                  flush_timeout_s: float = 5.0) -> Any:
    """Make a function or class continue the caller's trace when Ray runs it in a worker.

    Bare (``@traced_remote``) or with options (``@traced_remote(flush=False)``), always under
    ``@ray.remote``. On a class, every public method and ``__call__`` defined by the class or its
    bases is wrapped, in place.

    Args:
        obj: the function or class.
        flush: export the worker's finished spans before each call returns (default). Turn off
            only for very hot, short calls whose workers you shut down yourself.
        flush_timeout_s: bound on that flush.

    Returns:
        The wrapped function, or the class itself with its methods wrapped.
    """
    def decorate(target: Any) -> Any:
        if inspect.isclass(target):
            return _wrap_class(target, flush, flush_timeout_s)
        return _wrap(target, flush, flush_timeout_s)

    if obj is None:
        return decorate
    return decorate(obj)


# --- worker side ---------------------------------------------------------------------------------


def _wrap_class(cls: type, flush: bool, timeout_s: float) -> type:
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_") and name != "__call__":
                continue
            if not inspect.isfunction(attr) or getattr(attr, "_otel_verl_traced_remote", False):
                continue
            if inspect.isgeneratorfunction(attr) or inspect.isasyncgenfunction(attr):
                continue
            setattr(cls, name, _wrap(attr, flush, timeout_s))
    return cls


def _wrap(fn: Callable[..., Any], flush: bool, timeout_s: float) -> Callable[..., Any]:
    if getattr(fn, "_otel_verl_traced_remote", False):
        return fn
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"traced_remote does not support generator functions ({fn!r})")

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, _otel_verl_carrier: Any = None, **kwargs: Any) -> Any:
            carrier = _otel_verl_carrier
            RolloutTraceConfig.init_from_env()
            try:
                with use_context(carrier):
                    return await fn(*args, **kwargs)
            finally:
                if flush:
                    RolloutTraceConfig.flush(timeout_s)

        wrapper: Callable[..., Any] = async_wrapper
    else:
        @functools.wraps(fn)
        def sync_wrapper(*args: Any, _otel_verl_carrier: Any = None, **kwargs: Any) -> Any:
            carrier = _otel_verl_carrier
            RolloutTraceConfig.init_from_env()
            try:
                with use_context(carrier):
                    return fn(*args, **kwargs)
            finally:
                if flush:
                    RolloutTraceConfig.flush(timeout_s)

        wrapper = sync_wrapper

    # Ray validates call arguments against the signature, and for actor methods it looks through
    # `__wrapped__` to the innermost function (which has no carrier parameter). So: no
    # `__wrapped__`, and an explicit signature with the carrier (the wrapper's own signature
    # accepts it too, should `__signature__` get lost on the way).
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    wrapper.__signature__ = _with_carrier(inspect.signature(fn))  # type: ignore[attr-defined]
    wrapper._otel_verl_traced_remote = True  # type: ignore[attr-defined]
    return wrapper


def _with_carrier(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` plus a keyword-only ``_otel_verl_carrier=None`` (Ray validates call arguments)."""
    params = list(sig.parameters.values())
    if any(p.name == CARRIER_KWARG for p in params):
        return sig
    extra = inspect.Parameter(CARRIER_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
              len(params))
    params.insert(at, extra)
    return sig.replace(parameters=params)
