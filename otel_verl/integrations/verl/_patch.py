"""What otel_verl changes in verl, all of it undone by ``uninstall()``.

1. ``verl.utils.rollout_trace`` (patched right after it executes, through a post-import hook, so
   every verl module that later does ``from verl.utils.rollout_trace import ...`` gets ours):
   ``RolloutTraceConfig``, ``rollout_trace_attr`` and ``rollout_trace_op`` are replaced by
   otel_verl-backed versions with verl's signatures. verl's own ``mlflow``/``trackio`` backends
   still go to verl's code (the replacements delegate to the originals for them).
2. If verl modules were imported before the patch, their names are rebound and every method
   already decorated by verl's ``rollout_trace_op`` (recognised by the wrapper's code object) is
   re-decorated, in the classes of the modules that imported verl's decorator.
3. ``AgentLoopWorker.generate_sequences`` (public) sets which samples of the worker's chunk are
   traced, with otel_verl's deterministic ``TrajectorySampler`` instead of verl's unseeded
   ``np.random.choice`` (verl then sees ``max_samples_per_step_per_worker=None`` and marks every
   sample traceable; our ``rollout_trace_attr`` silences the unselected ones).
4. ``AgentLoopWorker._compute_score`` (private; signature checked, verl 0.9.x) gets a reward span
   and the score on the trajectory span (``record_reward``).
5. ``BaseTool.create`` / ``BaseTool.release`` of ``BaseTool`` and of every subclass (existing ones,
   and later ones through ``BaseTool.__init_subclass__``) get TOOL spans.
6. Engine context (vLLM only): verl's ``LLMServerClient.generate`` adds the W3C headers of its span
   to a copy of the request's ``sampling_params["extra_args"]``; in the vLLM server actor,
   ``vllm.v1.engine.async_llm.AsyncLLM.generate`` takes them out again and passes them as
   ``trace_headers=`` (only when vLLM's own tracing is on), so vLLM's ``llm_request`` span is a child
   of the ``LLMServerClient.generate`` span.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Any

from opentelemetry import trace as otel_trace

import otel_verl
from otel_verl import _env, _errors, semconv
from otel_verl._config import FOREIGN_BACKENDS
from otel_verl.semconv import GenAIOperation, SpanKindName

_log = logging.getLogger("otel_verl")

RT_MODULE = "verl.utils.rollout_trace"
AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
BASE_TOOL_MODULE = "verl.tools.base_tool"
VLLM_ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"

#: marks functions and classes otel_verl produced or already patched
_MARK = "__otel_verl_verl__"


class _State:
    """Process-wide patch state (one per process, guarded by ``_LOCK``)."""

    def __init__(self) -> None:
        self.installed = False
        self.upstream_active = False  # verl's own mlflow / trackio backend in use
        self.sampler_patched = False  # AgentLoopWorker.generate_sequences applies our sampler
        self.originals: dict[str, Any] = {}
        self.wrapper_codes: frozenset[CodeType] = frozenset()
        self.undo: list[Callable[[], None]] = []

    def active(self) -> bool:
        """True when verl's tracing goes through otel_verl."""
        return self.installed and not self.upstream_active


_S = _State()
_LOCK = threading.RLock()
#: the sample indices the current agent-loop worker call traces (None: no restriction)
_SELECTION: contextvars.ContextVar[frozenset | None] = contextvars.ContextVar(
    "otel_verl_verl_selection", default=None)


def _norm(index: Any) -> Any:
    """numpy scalars -> Python scalars, so ranks and set membership agree with plain ints."""
    item = getattr(index, "item", None)
    if callable(item) and type(index).__module__ == "numpy":
        try:
            return item()
        except Exception:
            return index
    return index


# --- 1. the verl-facing RolloutTraceConfig -------------------------------------------------------


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
        if _S.sampler_patched:
            return None
        return self._core.max_samples_per_step_per_worker


def _verl_keys(project_name: Any, experiment_name: Any, backend: Any, token2text: Any,
               max_samples: Any) -> dict[str, Any]:
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
    return {"actor_rollout_ref": {"rollout": {"trace": trace}}}


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
        with _LOCK:
            if _S.upstream_active or otel_verl.RolloutTraceConfig._instance is not None:
                return
            name = backend.strip().lower() if isinstance(backend, str) else backend
            original = _S.originals.get("RolloutTraceConfig")
            if name in FOREIGN_BACKENDS and original is not None:
                original.init(project_name, experiment_name, backend, token2text,
                              max_samples_per_step_per_worker)
                _S.upstream_active = True
                return
            otel_verl.RolloutTraceConfig.init(
                verl_config=_verl_keys(project_name, experiment_name, backend, token2text,
                                       max_samples_per_step_per_worker),
                **otel_options)

    @classmethod
    def get_instance(cls) -> Any:
        if _S.upstream_active:
            return _S.originals["RolloutTraceConfig"].get_instance()
        return _InstanceView(otel_verl.RolloutTraceConfig.get_instance())

    @classmethod
    def get_backend(cls) -> str | None:
        if _S.upstream_active:
            return _S.originals["RolloutTraceConfig"].get_backend()
        return otel_verl.RolloutTraceConfig.get_backend()

    @classmethod
    def get_client(cls) -> Any:
        if _S.upstream_active:
            return _S.originals["RolloutTraceConfig"].get_client()
        return otel_verl.RolloutTraceConfig.get_client()

    @classmethod
    def enable_token2text(cls) -> bool | None:
        if _S.upstream_active:
            return _S.originals["RolloutTraceConfig"].enable_token2text()
        return otel_verl.RolloutTraceConfig.enable_token2text()

    @classmethod
    def reset(cls) -> None:
        with _LOCK:
            otel_verl.RolloutTraceConfig.reset()
            original = _S.originals.get("RolloutTraceConfig")
            if original is not None:
                original.reset()
            _S.upstream_active = False

    # otel_verl extras, for code that wants them through verl's name
    @classmethod
    def flush(cls, timeout_s: float = 5.0) -> bool:
        return otel_verl.RolloutTraceConfig.flush(timeout_s)

    @classmethod
    def sampler(cls) -> otel_verl.TrajectorySampler:
        return otel_verl.RolloutTraceConfig.sampler()


setattr(RolloutTraceConfig, _MARK, True)


# --- 1. rollout_trace_attr -----------------------------------------------------------------------


@contextlib.contextmanager
def rollout_trace_attr(sample_index: Any = None, step: Any = None, rollout_n: Any = None,
                       name: str = "rollout_trace", validate: bool = False,
                       trace: bool = True) -> Iterator[Any]:
    """verl's ``rollout_trace_attr`` through otel_verl (same arguments).

    Inside a patched ``AgentLoopWorker.generate_sequences``, samples that otel_verl's sampler did
    not select are silenced (``trace=False``) whatever verl passed.
    """
    if not _S.active():
        original = _S.originals.get("rollout_trace_attr")
        if original is None:
            yield None
            return
        with original(sample_index=sample_index, step=step, rollout_n=rollout_n, name=name,
                      validate=validate, trace=trace):
            yield None
        return
    sample_index = _norm(sample_index)
    selection = _SELECTION.get()
    if trace and selection is not None and sample_index not in selection:
        trace = False
    with otel_verl.rollout_trace_attr(sample_index=sample_index, step=_norm(step),
                                      rollout_n=_norm(rollout_n), name=name, validate=validate,
                                      trace=trace) as span:
        yield span


setattr(rollout_trace_attr, _MARK, True)


# --- 1. rollout_trace_op -------------------------------------------------------------------------


def _current_span() -> Any:
    span = otel_trace.get_current_span()
    return span if span.is_recording() else None


def _safe(where: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:
        _errors.internal_error(exc, where)


#: the key under ``SamplingParams.extra_args`` that carries the W3C headers from verl's
#: ``LLMServerClient.generate`` (agent-loop worker) to vLLM's ``AsyncLLM.generate`` (server actor)
VLLM_EXTRA_ARGS_KEY = "otel_verl_trace_headers"


def _rollout_engine(owner: Any) -> str | None:
    try:
        return str(owner.config.actor_rollout_ref.rollout.name)
    except Exception:
        return None


def _carry_context_to_vllm(owner: Any, kwargs: dict[str, Any]) -> None:
    """Add the current span's traceparent to the request's ``extra_args`` (a copy; vLLM only).

    verl's vLLM server builds ``SamplingParams(**sampling_params)``, so the headers reach the
    engine's process inside the request itself; ``patch_vllm_async_llm`` hands them to
    ``AsyncLLM.generate(trace_headers=...)`` there. SGLang rejects unknown sampling keys: no carry.
    """
    params = kwargs.get("sampling_params")
    if not isinstance(params, dict) or _rollout_engine(owner) != "vllm":
        return
    headers = otel_verl.traceparent_headers()
    if not headers:
        return
    extra = params.get("extra_args")
    extra = dict(extra) if isinstance(extra, dict) else {}
    extra[VLLM_EXTRA_ARGS_KEY] = headers
    kwargs["sampling_params"] = {**params, "extra_args": extra}


def _llm_request_attrs(owner: Any, kwargs: dict[str, Any]) -> None:
    span = _current_span()
    if span is None:
        return
    _carry_context_to_vllm(owner, kwargs)
    params = kwargs.get("sampling_params") or {}
    attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: GenAIOperation.TEXT_COMPLETION}
    for key, attr in (("temperature", semconv.GEN_AI_REQUEST_TEMPERATURE),
                      ("top_p", semconv.GEN_AI_REQUEST_TOP_P),
                      ("top_k", semconv.GEN_AI_REQUEST_TOP_K),
                      ("max_tokens", semconv.GEN_AI_REQUEST_MAX_TOKENS)):
        value = params.get(key) if isinstance(params, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attrs[attr] = value
    prompt_ids = kwargs.get("prompt_ids")
    if prompt_ids is not None and hasattr(prompt_ids, "__len__"):
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt_ids)
    span.set_attributes(attrs)


def _llm_response_attrs(result: Any) -> None:
    span = _current_span()
    token_ids = getattr(result, "token_ids", None)
    if span is None or token_ids is None:
        return
    span.set_attribute(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, len(token_ids))
    stop = getattr(result, "stop_reason", None)
    if isinstance(stop, str):
        span.set_attribute(semconv.GEN_AI_RESPONSE_FINISH_REASONS, [stop])


def _tool_attrs(owner: Any, operation: str | None) -> None:
    span = _current_span()
    if span is None:
        return
    name = getattr(owner, "name", None)
    if isinstance(name, str):
        span.set_attribute(semconv.GEN_AI_TOOL_NAME, name)
    if operation is not None:
        span.set_attribute(semconv.GEN_AI_OPERATION_NAME, operation)


def _agent_attrs(owner: Any) -> None:
    span = _current_span()
    if span is not None:
        span.set_attributes({semconv.GEN_AI_OPERATION_NAME: GenAIOperation.INVOKE_AGENT,
                             semconv.GEN_AI_AGENT_NAME: type(owner).__name__})


def _agent_result(result: Any) -> None:
    turns = getattr(result, "num_turns", None)
    if isinstance(turns, int):
        otel_verl.set_trajectory_attribute(semconv.ROLLOUT_NUM_TURNS, turns)


#: verl's traced methods by name -> (openinference kind, before(owner, kwargs), after(result))
def _role(func: Callable[..., Any]) -> tuple[str, Callable[..., None] | None,
                                            Callable[[Any], None] | None]:
    name = func.__name__
    if name == "generate":
        return SpanKindName.LLM, _llm_request_attrs, _llm_response_attrs
    if name == "execute":
        return SpanKindName.TOOL, lambda owner, kwargs: _tool_attrs(
            owner, GenAIOperation.EXECUTE_TOOL), None
    if name == "run":
        return SpanKindName.AGENT, lambda owner, kwargs: _agent_attrs(owner), _agent_result
    return SpanKindName.CHAIN, None, None


def _with_attrs(func: Callable[..., Any], before: Callable[..., None] | None,
                after: Callable[[Any], None] | None) -> Callable[..., Any]:
    """Run inside the op span: add GenAI attributes before/after the call (never raising)."""
    if before is None and after is None:
        return func
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            if before is not None and args:
                _safe("verl span attributes", lambda: before(args[0], kwargs))
            result = await func(*args, **kwargs)
            if after is not None:
                _safe("verl span attributes", lambda: after(result))
            return result

        return traced_async
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        return func

    @functools.wraps(func)
    def traced_sync(*args: Any, **kwargs: Any) -> Any:
        if before is not None and args:
            _safe("verl span attributes", lambda: before(args[0], kwargs))
        result = func(*args, **kwargs)
        if after is not None:
            _safe("verl span attributes", lambda: after(result))
        return result

    return traced_sync


def _dispatcher(func: Callable[..., Any], theirs: Callable[..., Any]) -> Callable[..., Any]:
    """One function that runs otel_verl's op while installed, verl's original otherwise."""
    kind, before, after = _role(func)
    ours = otel_verl.rollout_trace_op(_with_attrs(func, before, after),
                                      name=func.__qualname__, kind=kind)
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def dispatch_async(*args: Any, **kwargs: Any) -> Any:
            if _S.active():
                return await ours(*args, **kwargs)
            return await theirs(*args, **kwargs)

        dispatch: Callable[..., Any] = dispatch_async
    else:
        @functools.wraps(func)
        def dispatch_sync(*args: Any, **kwargs: Any) -> Any:
            if _S.active():
                return ours(*args, **kwargs)
            return theirs(*args, **kwargs)

        dispatch = dispatch_sync
    setattr(dispatch, _MARK, True)
    return dispatch


def rollout_trace_op(func: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``rollout_trace_op`` through otel_verl: the span is named ``func.__qualname__``.

    Spans also get ``openinference.span.kind`` and GenAI attributes by verl's method names:
    ``generate`` (LLM: request parameters, token usage), ``execute`` (TOOL: ``gen_ai.tool.name``),
    ``run`` (AGENT; ``rollout.num_turns`` on the trajectory span), anything else CHAIN.
    """
    original = _S.originals.get("rollout_trace_op")
    theirs = original(func) if original is not None else func
    return _dispatcher(func, theirs)


setattr(rollout_trace_op, _MARK, True)

_REPLACEMENTS = {
    "RolloutTraceConfig": RolloutTraceConfig,
    "rollout_trace_attr": rollout_trace_attr,
    "rollout_trace_op": rollout_trace_op,
}


def _set(owner: Any, name: str, value: Any) -> None:
    """setattr with its undo recorded."""
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

    _S.undo.append(undo)


def patch_rollout_trace(module: ModuleType) -> None:
    """Post-import hook of ``verl.utils.rollout_trace``: swap in ours, reroute what exists."""
    with _LOCK:
        if not _S.installed or getattr(module, _MARK, False):
            return
        originals = {name: getattr(module, name, None) for name in _REPLACEMENTS}
        if any(value is None for value in originals.values()):
            _log.warning("otel_verl: %s lacks %s; verl's tracing is not rerouted", RT_MODULE,
                         [k for k, v in originals.items() if v is None])
            return
        _S.originals = originals
        op_code = getattr(originals["rollout_trace_op"], "__code__", None)
        _S.wrapper_codes = frozenset(c for c in (op_code.co_consts if op_code else ())
                                     if isinstance(c, CodeType))
        for name, replacement in _REPLACEMENTS.items():
            _set(module, name, replacement)
        _set(module, _MARK, True)
        _adopt_upstream_init(originals["RolloutTraceConfig"])
        _reroute_loaded_modules(module)


def _adopt_upstream_init(original: Any) -> None:
    """If verl's own init already ran in this process (install came late), replay it in ours."""
    instance = getattr(original, "_instance", None)
    if instance is None or not getattr(instance, "_initialized", False):
        return
    if instance.backend in FOREIGN_BACKENDS:
        _S.upstream_active = True
        return
    RolloutTraceConfig.init(instance.project_name, instance.experiment_name, instance.backend,
                            instance.token2text, instance.max_samples_per_step_per_worker)


def _reroute_loaded_modules(rt_module: ModuleType) -> None:
    """Late install: rebind verl's names and re-decorate methods verl's decorator already made."""
    by_identity = {id(value): name for name, value in _S.originals.items()}
    for mod in list(sys.modules.values()):
        namespace = getattr(mod, "__dict__", None)
        if mod is rt_module or not isinstance(namespace, dict):
            continue
        imported = [(key, by_identity[id(value)]) for key, value in list(namespace.items())
                    if id(value) in by_identity and value is _S.originals.get(by_identity[id(value)])]
        if not imported:
            continue
        for key, original_name in imported:
            _set(mod, key, _REPLACEMENTS[original_name])
        mod_name = getattr(mod, "__name__", None)
        for value in list(namespace.values()):
            if isinstance(value, type) and value.__module__ == mod_name:
                _reroute_class(value)


def _reroute_class(cls: type) -> None:
    for attr, value in list(vars(cls).items()):
        if isinstance(value, FunctionType) and value.__code__ in _S.wrapper_codes:
            func = getattr(value, "__wrapped__", None)
            if func is not None:
                _set(cls, attr, _dispatcher(func, value))


# --- 3./4. the agent-loop worker: sampling and reward --------------------------------------------


def patch_agent_loop(module: ModuleType) -> None:
    """Post-import hook of verl's agent-loop module."""
    with _LOCK:
        worker = getattr(module, "AgentLoopWorker", None)
        if not _S.installed or worker is None or getattr(worker, _MARK, False):
            return
        generate = worker.__dict__.get("generate_sequences")
        if inspect.iscoroutinefunction(generate):
            _set(worker, "generate_sequences", _sampling_generate_sequences(generate))
            _S.sampler_patched = True
            _S.undo.append(lambda: setattr(_S, "sampler_patched", False))
        else:
            _log.warning("otel_verl: AgentLoopWorker.generate_sequences not found or not async; "
                         "verl's own (random) trace sampling stays in effect")
        score = worker.__dict__.get("_compute_score")
        params = list(inspect.signature(score).parameters) if callable(score) else []
        if inspect.iscoroutinefunction(score) and params == ["self", "outputs", "kwargs"]:
            _set(worker, "_compute_score", _traced_compute_score(score))
        else:
            _log.warning("otel_verl: AgentLoopWorker._compute_score has an unknown signature %s "
                         "(verl version not supported for reward spans); reward is not traced",
                         params)
        _set(worker, _MARK, True)


def _sampling_generate_sequences(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def generate_sequences(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        token = None
        if _S.active():
            try:
                sampler = otel_verl.RolloutTraceConfig.sampler()
                if sampler.limit is not None:
                    index = batch.non_tensor_batch.get("index")
                    indices = (index.tolist() if index is not None else list(range(len(batch))))
                    token = _SELECTION.set(sampler.select(_norm(i) for i in indices))
            except Exception as exc:
                _errors.internal_error(exc, "verl trace sampling")
        try:
            return await original(self, batch, *args, **kwargs)
        finally:
            if token is not None:
                _SELECTION.reset(token)

    return generate_sequences


def _traced_compute_score(original: Callable[..., Any]) -> Callable[..., Any]:
    span_name = original.__qualname__

    @functools.wraps(original)
    async def _compute_score(self: Any, outputs: Any, kwargs: Any) -> Any:
        if not (_S.active() and otel_verl.is_recording()) or not outputs:
            return await original(self, outputs, kwargs)
        final = outputs[-1]
        computed_here = (getattr(final, "reward_score", None) is None
                         and getattr(self, "reward_loop_worker_handles", None) is not None)
        if not computed_here:  # no reward here, or the agent loop already computed it
            result = await original(self, outputs, kwargs)
            _record(final)
            return result
        parent = otel_trace.get_current_span()
        attrs = {semconv.OPENINFERENCE_SPAN_KIND: SpanKindName.EVALUATOR,
                 semconv.GEN_AI_OPERATION_NAME: GenAIOperation.EVALUATE,
                 semconv.GEN_AI_EVALUATION_NAME: "reward"}
        if getattr(parent, "attributes", None) and parent.attributes.get(
                semconv.OTEL_VERL_TRAJECTORY):
            attrs[semconv.OTEL_VERL_TRAJECTORY_CHILD] = True
        with otel_verl.get_tracer().start_as_current_span(span_name, attributes=attrs) as span:
            otel_verl.set_payload(span, input={
                "data_source": kwargs.get("data_source") if isinstance(kwargs, dict) else None,
                "reward_model": kwargs.get("reward_model") if isinstance(kwargs, dict) else None,
                "num_turns": [getattr(o, "num_turns", None) for o in outputs],
                "response_length": [len(getattr(o, "response_ids", ()) or ()) for o in outputs],
            })
            result = await original(self, outputs, kwargs)
            score = getattr(final, "reward_score", None)
            extra = getattr(final, "extra_fields", None) or {}
            otel_verl.set_payload(span, output={"reward_score": score,
                                               "reward_extra_info": extra.get("reward_extra_info")})
            if isinstance(score, (int, float)):
                span.set_attribute(semconv.GEN_AI_EVALUATION_SCORE_VALUE, float(score))
        _record(final)
        return result

    return _compute_score


def _record(final: Any) -> None:
    score = getattr(final, "reward_score", None)
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        otel_verl.record_reward(score)


# --- 5. tools: create / release ------------------------------------------------------------------


#: the tool lifecycle step running now, so ``super().create(...)`` inside a subclass's ``create``
#: does not open a second span
_TOOL_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "otel_verl_verl_tool_step", default=None)


def _lifecycle(func: Callable[..., Any], step: str) -> Callable[..., Any]:
    traced = otel_verl.rollout_trace_op(
        _with_attrs(func, lambda owner, kwargs: _tool_attrs(owner, None), None),
        name=func.__qualname__, kind=SpanKindName.TOOL)

    @functools.wraps(func)
    async def lifecycle(*args: Any, **kwargs: Any) -> Any:
        if _TOOL_STEP.get() == step:  # super().create() from a subclass's create: one span
            return await func(*args, **kwargs)
        token = _TOOL_STEP.set(step)
        try:
            return await traced(*args, **kwargs)
        finally:
            _TOOL_STEP.reset(token)

    setattr(lifecycle, _MARK, True)
    return lifecycle


def _wrap_tool_lifecycle(cls: type) -> None:
    for name in ("create", "release"):
        func = cls.__dict__.get(name)
        if not inspect.iscoroutinefunction(func) or getattr(func, _MARK, False):
            continue
        _set(cls, name, _lifecycle(func, name))


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def patch_base_tool(module: ModuleType) -> None:
    """Post-import hook of ``verl.tools.base_tool``."""
    with _LOCK:
        base = getattr(module, "BaseTool", None)
        if not _S.installed or base is None or getattr(base, _MARK, False):
            return
        for cls in (base, *_subclasses(base)):
            _wrap_tool_lifecycle(cls)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            super(base, cls).__init_subclass__(**kwargs)
            if _S.installed:
                _safe("tool span wrapping", lambda: _wrap_tool_lifecycle(cls))

        _set(base, "__init_subclass__", classmethod(__init_subclass__))
        _set(base, _MARK, True)


# --- 6. vLLM in the server actor: the carried headers become AsyncLLM.generate(trace_headers=) ----


def patch_vllm_async_llm(module: ModuleType) -> None:
    """Post-import hook of ``vllm.v1.engine.async_llm`` (in verl's vLLM server actor process)."""
    with _LOCK:
        engine = getattr(module, "AsyncLLM", None)
        generate = getattr(engine, "generate", None) if engine is not None else None
        if not _S.installed or generate is None or getattr(generate, _MARK, False):
            return
        try:
            params = inspect.signature(generate).parameters
        except (TypeError, ValueError):
            return
        if "trace_headers" not in params or "sampling_params" not in params:
            _log.warning("otel_verl: vLLM's AsyncLLM.generate takes no trace_headers; engine "
                         "spans will not join the rollout's traces")
            return
        _set(engine, "generate", _engine_generate(generate))


def _engine_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _take_carried_headers(self, args, kwargs)
        except Exception as exc:
            _errors.internal_error(exc, "vLLM trace headers")
        return original(self, *args, **kwargs)

    setattr(generate, _MARK, True)
    return generate


def _take_carried_headers(engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    extra = getattr(params, "extra_args", None)
    if not isinstance(extra, dict) or VLLM_EXTRA_ARGS_KEY not in extra:
        return
    headers = extra.pop(VLLM_EXTRA_ARGS_KEY)  # keep the engine core's request clean
    if not extra:
        params.extra_args = None
    observability = getattr(engine, "observability_config", None)
    tracing_on = getattr(observability, "otlp_traces_endpoint", None) is not None
    # with vLLM's tracing off it would drop the headers with a warning per request: don't pass
    if tracing_on and isinstance(headers, dict) and kwargs.get("trace_headers") is None:
        kwargs["trace_headers"] = {str(k): str(v) for k, v in headers.items()}


# --- install / uninstall -------------------------------------------------------------------------


def mark_installed() -> bool:
    """Returns False when already installed."""
    with _LOCK:
        if _S.installed:
            return False
        _S.installed = True
        return True


def undo_all() -> None:
    with _LOCK:
        while _S.undo:
            undo = _S.undo.pop()
            _safe("uninstall", undo)
        _S.installed = False
        _S.upstream_active = False
        _S.sampler_patched = False


def is_installed() -> bool:
    return _S.installed
