"""verl's tracing module, ``verl.utils.rollout_trace``, backed by otel_verl.

A post-import hook swaps ``RolloutTraceConfig``, ``rollout_trace_attr`` and ``rollout_trace_op``
for the versions below (same signatures) right after the module executes, so every verl module
that later does ``from verl.utils.rollout_trace import ...`` gets them. verl's own
``mlflow``/``trackio`` backends still go to verl's code. If verl modules were imported first, their
names are rebound and every method verl's decorator already wrapped (recognised by the wrapper's
code object) is re-decorated, in the classes of the modules that imported verl's decorator.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Any

import otel_verl
from otel_verl import _env
from otel_verl._config import FOREIGN_BACKENDS
from otel_verl._decorator import default_kind
from otel_verl.integrations.verl import _agent_loop, _tools, _vllm
from otel_verl.integrations.verl._common import LOCK, MARK, S, check_verl_version, norm, set_attr

_log = logging.getLogger("otel_verl")

RT_MODULE = "verl.utils.rollout_trace"


# --- RolloutTraceConfig --------------------------------------------------------------------------


class _InstanceView:
    """What verl reads from ``RolloutTraceConfig.get_instance()`` (attributes of otel_verl's)."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    @property
    def max_samples_per_step_per_worker(self) -> int | None:
        # verl's worker would pick samples at random with this; our patched
        # generate_sequences picks them deterministically instead
        if S.sampler_patched:
            return None
        return self._core.max_samples_per_step_per_worker


def _caller_rollout_n(frame: Any) -> int | None:
    """verl's ``actor_rollout_ref.rollout.n`` from the object whose method called ``init``.

    verl calls ``RolloutTraceConfig.init`` from ``AgentLoopWorker.__init__`` with the trace keys
    only; the worker's ``self.config`` is verl's whole config. The GRPO group size is handed to
    otel_verl's ``group_size`` (its verl key is ``actor_rollout_ref.rollout.n``); anything
    unexpected just leaves it unset.
    """
    try:
        owner = frame.f_locals.get("self") if frame is not None else None
        n = owner.config.actor_rollout_ref.rollout.n if owner is not None else None
    except Exception:  # noqa: BLE001 - optional: not verl's worker, or another config shape
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _verl_keys(project_name: Any, experiment_name: Any, backend: Any, token2text: Any,
               max_samples: Any, rollout_n: int | None = None) -> dict[str, Any]:
    """verl's init arguments as verl config keys (so they rank as verl keys, above the env)."""
    trace: dict[str, Any] = {}
    if project_name is not None:
        trace["project_name"] = project_name
    if experiment_name is not None:
        trace["experiment_name"] = experiment_name
    if backend is not None or not os.environ.get(_env.OTEL_VERL_BACKEND):
        # verl's null means "off"; only OTEL_VERL_BACKEND can turn tracing on behind it
        trace["backend"] = backend
    if token2text is not None:
        trace["token2text"] = bool(token2text)
    if max_samples is not None:
        trace["max_samples_per_step_per_worker"] = max_samples
    rollout: dict[str, Any] = {"trace": trace}
    if rollout_n is not None:
        rollout["n"] = rollout_n
    return {"actor_rollout_ref": {"rollout": rollout}}


class RolloutTraceConfig:
    """``verl.utils.rollout_trace.RolloutTraceConfig`` backed by ``otel_verl.RolloutTraceConfig``.

    Same classmethods and arguments as verl's; the backends are otel_verl's (``file``, ``otlp``,
    ``weave``, ``console``, ``none``; null = off) plus verl's own ``mlflow``/``trackio``, which are
    handed to verl's original class. Only the first ``init`` in a process takes effect.
    """

    @classmethod
    def init(cls, project_name: str | None, experiment_name: str | None,
             backend: str | None = None, token2text: bool = False,
             max_samples_per_step_per_worker: int | None = None, **otel_options: Any) -> None:
        with LOCK:
            if S.upstream_active or otel_verl.RolloutTraceConfig._instance is not None:
                return
            name = backend.strip().lower() if isinstance(backend, str) else backend
            original = S.originals.get("RolloutTraceConfig")
            if name in FOREIGN_BACKENDS and original is not None:
                original.init(project_name, experiment_name, backend, token2text,
                              max_samples_per_step_per_worker)
                S.upstream_active = True
                return
            otel_verl.RolloutTraceConfig.init(
                verl_config=_verl_keys(project_name, experiment_name, backend, token2text,
                                       max_samples_per_step_per_worker,
                                       _caller_rollout_n(sys._getframe(1))),
                **otel_options)

    @classmethod
    def get_instance(cls) -> Any:
        if S.upstream_active:
            return S.originals["RolloutTraceConfig"].get_instance()
        return _InstanceView(otel_verl.RolloutTraceConfig.get_instance())

    @classmethod
    def get_backend(cls) -> str | None:
        if S.upstream_active:
            return S.originals["RolloutTraceConfig"].get_backend()
        return otel_verl.RolloutTraceConfig.get_backend()

    @classmethod
    def get_client(cls) -> Any:
        if S.upstream_active:
            return S.originals["RolloutTraceConfig"].get_client()
        return otel_verl.RolloutTraceConfig.get_client()

    @classmethod
    def enable_token2text(cls) -> bool | None:
        if S.upstream_active:
            return S.originals["RolloutTraceConfig"].enable_token2text()
        return otel_verl.RolloutTraceConfig.enable_token2text()

    @classmethod
    def reset(cls) -> None:
        with LOCK:
            otel_verl.RolloutTraceConfig.reset()
            original = S.originals.get("RolloutTraceConfig")
            if original is not None:
                original.reset()
            S.upstream_active = False

    # otel_verl extras, for code that wants them through verl's name
    @classmethod
    def flush(cls, timeout_s: float = 5.0) -> bool:
        return otel_verl.RolloutTraceConfig.flush(timeout_s)

    @classmethod
    def sampler(cls) -> otel_verl.TrajectorySampler:
        return otel_verl.RolloutTraceConfig.sampler()


setattr(RolloutTraceConfig, MARK, True)


# --- rollout_trace_attr --------------------------------------------------------------------------


@contextlib.contextmanager
def rollout_trace_attr(sample_index: Any = None, step: Any = None, rollout_n: Any = None,
                       name: str = "rollout_trace", validate: bool = False,
                       trace: bool = True) -> Iterator[Any]:
    """verl's ``rollout_trace_attr`` through otel_verl (same arguments).

    Inside a patched ``AgentLoopWorker.generate_sequences``, samples that otel_verl's sampler did
    not select are silenced (``trace=False``) whatever verl passed.
    """
    if not S.active():
        original = S.originals.get("rollout_trace_attr")
        if original is None:
            yield None
            return
        with original(sample_index=sample_index, step=step, rollout_n=rollout_n, name=name,
                      validate=validate, trace=trace):
            yield None
        return
    sample_index = norm(sample_index)
    if trace and not _agent_loop.is_selected(sample_index):
        trace = False
    with otel_verl.rollout_trace_attr(sample_index=sample_index, step=norm(step),
                                      rollout_n=norm(rollout_n), name=name, validate=validate,
                                      trace=trace) as span:
        yield span


setattr(rollout_trace_attr, MARK, True)


# --- rollout_trace_op ----------------------------------------------------------------------------

Before = Callable[[Any, dict[str, Any]], None]
After = Callable[[Any], None]

#: verl's traced methods by name -> (before(owner, kwargs), after(result)), the hooks coming from
#: the module of the surface they describe; the op's kind comes from the same names
#: (``otel_verl._decorator.KIND_BY_METHOD_NAME``: generate = LLM, execute = TOOL, run = AGENT)
_HOOKS: dict[str, tuple[Before | None, After | None]] = {
    "generate": (_vllm.generate_before, _vllm.generate_after),
    "execute": (_tools.execute_before, None),
    "run": (_agent_loop.run_before, _agent_loop.run_after),
}


def _dispatcher(func: Callable[..., Any], theirs: Callable[..., Any]) -> Callable[..., Any]:
    """One function that runs otel_verl's op while installed, verl's original otherwise."""
    kind = default_kind(func)
    before, after = _HOOKS.get(func.__name__, (None, None))
    # the GenAI attributes come from otel_verl's own before/after hooks (inside the op's span)
    ours = otel_verl.rollout_trace_op(func, name=func.__qualname__, kind=kind, before=before,
                                      after=after)
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def dispatch_async(*args: Any, **kwargs: Any) -> Any:
            if S.active():
                return await ours(*args, **kwargs)
            return await theirs(*args, **kwargs)

        dispatch: Callable[..., Any] = dispatch_async
    else:
        @functools.wraps(func)
        def dispatch_sync(*args: Any, **kwargs: Any) -> Any:
            if S.active():
                return ours(*args, **kwargs)
            return theirs(*args, **kwargs)

        dispatch = dispatch_sync
    setattr(dispatch, MARK, True)
    return dispatch


def rollout_trace_op(func: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``rollout_trace_op`` through otel_verl: the span is named ``func.__qualname__``.

    Spans also get ``openinference.span.kind`` and GenAI attributes by verl's method names:
    ``generate`` (LLM: request parameters, token usage), ``execute`` (TOOL: ``gen_ai.tool.name``),
    ``run`` (AGENT; ``rollout.num_turns`` on the trajectory span), anything else CHAIN.
    """
    original = S.originals.get("rollout_trace_op")
    theirs = original(func) if original is not None else func
    return _dispatcher(func, theirs)


setattr(rollout_trace_op, MARK, True)

REPLACEMENTS = {
    "RolloutTraceConfig": RolloutTraceConfig,
    "rollout_trace_attr": rollout_trace_attr,
    "rollout_trace_op": rollout_trace_op,
}


# --- the post-import hook ------------------------------------------------------------------------


def patch_rollout_trace(module: ModuleType) -> None:
    """Post-import hook of ``verl.utils.rollout_trace``: swap in ours, reroute what exists."""
    with LOCK:
        if not S.installed or getattr(module, MARK, False):
            return
        originals = {name: getattr(module, name, None) for name in REPLACEMENTS}
        if any(value is None for value in originals.values()):
            _log.warning("otel_verl: %s lacks %s; verl's tracing is not rerouted", RT_MODULE,
                         [k for k, v in originals.items() if v is None])
            return
        S.originals = originals
        check_verl_version(_installed_verl())
        op_code = getattr(originals["rollout_trace_op"], "__code__", None)
        S.wrapper_codes = frozenset(c for c in (op_code.co_consts if op_code else ())
                                    if isinstance(c, CodeType))
        for name, replacement in REPLACEMENTS.items():
            set_attr(module, name, replacement)
        set_attr(module, MARK, True)
        _adopt_upstream_init(originals["RolloutTraceConfig"])
        _reroute_loaded_modules(module)


def _installed_verl() -> str | None:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _adopt_upstream_init(original: Any) -> None:
    """If verl's own init already ran in this process (install came late), replay it in ours."""
    instance = getattr(original, "_instance", None)
    if instance is None or not getattr(instance, "_initialized", False):
        return
    if instance.backend in FOREIGN_BACKENDS:
        S.upstream_active = True
        return
    RolloutTraceConfig.init(instance.project_name, instance.experiment_name, instance.backend,
                            instance.token2text, instance.max_samples_per_step_per_worker)


def _reroute_loaded_modules(rt_module: ModuleType) -> None:
    """Late install: rebind verl's names and re-decorate methods verl's decorator already made."""
    by_identity = {id(value): name for name, value in S.originals.items()}
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if mod is rt_module or not isinstance(namespace, dict):
            continue
        imported = [(key, by_identity[id(value)]) for key, value in list(namespace.items())
                    if id(value) in by_identity and value is S.originals.get(by_identity[id(value)])]
        if not imported:
            continue
        for key, original_name in imported:
            set_attr(mod, key, REPLACEMENTS[original_name])
        mod_name = getattr(mod, "__name__", None)
        for value in list(namespace.values()):
            if isinstance(value, type) and value.__module__ == mod_name:
                _reroute_class(value)


def _reroute_class(cls: type) -> None:
    for attr, value in list(vars(cls).items()):
        if isinstance(value, FunctionType) and value.__code__ in S.wrapper_codes:
            func = getattr(value, "__wrapped__", None)
            if func is not None:
                set_attr(cls, attr, _dispatcher(func, value))
