"""verl's agent loop: which samples are traced, the agent span's attributes, the reward.

- ``AgentLoopWorker.generate_sequences`` (public) chooses the traced samples of the worker's chunk
  with otel_verl's deterministic ``TrajectorySampler`` instead of verl's unseeded
  ``np.random.choice`` (verl then reads ``max_samples_per_step_per_worker=None`` and marks every
  sample traceable; the facade's ``rollout_trace_attr`` silences the unselected ones).
- ``*AgentLoop.run`` (verl's op) gets the AGENT attributes and ``rollout.num_turns``.
- ``AgentLoopWorker._compute_score`` (private; signature checked, verl 0.9.x) gets a reward span
  and the score on the trajectory span (``record_reward``).
- verl's v1 trainer (``trainer.use_v1=True``, verl 0.9's default) runs ``AgentLoopWorkerTQ``
  (``verl.trainer.ppo.v1.agent_loop_tq``), whose ``generate_sequences`` overrides the one above,
  returns before its rollouts finish (they run as background tasks) and passes ``trace=False``
  (a TODO in verl). Its ``generate_sequences`` gets the same sampler, and its ``_run_agent_loop``
  turns ``trace`` back on and sets ``rollout_n`` from the session id (verl gives all ``n`` sessions
  of a prompt the same trajectory record, ``rollout_n=0``).
- Any other ``AgentLoopWorker`` subclass that overrides how samples are run is an unknown trainer:
  one warning names it and what is not traced.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from opentelemetry import trace as otel_trace

import otel_verl
from otel_verl import _errors, semconv
from otel_verl.integrations.verl import _parity
from otel_verl.integrations.verl._common import (
    LOCK,
    MARK,
    S,
    current_span,
    for_each_subclass,
    norm,
    set_attr,
    warn_once,
)
from otel_verl.semconv import GenAIOperation, SpanKindName

_log = logging.getLogger("otel_verl")

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
AGENT_LOOP_TQ_MODULE = "verl.trainer.ppo.v1.agent_loop_tq"

#: AgentLoopWorker subclasses otel_verl knows (module, class name): their rollouts are traced
KNOWN_WORKERS = frozenset({(AGENT_LOOP_TQ_MODULE, "AgentLoopWorkerTQ")})
#: the methods through which a worker subclass could bypass the traced path
_RUN_METHODS = ("generate_sequences", "_run_agent_loop")

#: the sample indices the current agent-loop worker call traces (None: no restriction)
SELECTION: contextvars.ContextVar[frozenset | None] = contextvars.ContextVar(
    "otel_verl_verl_selection", default=None)


def is_selected(sample_index: Any) -> bool:
    """False only for a sample the current worker call's sampler did not choose."""
    selection = SELECTION.get()
    return selection is None or sample_index in selection


# --- *AgentLoop.run ------------------------------------------------------------------------------


#: the tokenizer of the ``*AgentLoop`` whose ``run`` is in progress (set by ``run_before`` in the
#: trajectory's task, read by ``run_after`` in the same task)
_RUN_TOKENIZER: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "otel_verl_verl_run_tokenizer", default=None)


def run_before(owner: Any, kwargs: dict[str, Any]) -> None:
    """Inside verl's ``*AgentLoop.run`` op span: the GenAI agent attributes, and the prompt as the
    trajectory's input (what Phoenix, Jaeger and ``traces list`` show on the root)."""
    span = current_span()
    if span is not None:
        span.set_attributes({semconv.GEN_AI_OPERATION_NAME: GenAIOperation.INVOKE_AGENT,
                             semconv.GEN_AI_AGENT_NAME: type(owner).__name__})
    prompt = kwargs.get("raw_prompt")
    if prompt is not None:
        # verl hands the chat messages over as a numpy object array or a list
        otel_verl.set_trajectory_input(prompt if isinstance(prompt, (str, dict))
                                       else list(prompt))
    _RUN_TOKENIZER.set(getattr(owner, "tokenizer", None))


def run_after(result: Any) -> None:
    """After ``*AgentLoop.run``: the number of turns on the trajectory span, and its outcome (the
    response as text with ``token2text``, its length and turns) as the trajectory's output."""
    turns = getattr(result, "num_turns", None)
    outcome: dict[str, Any] = {}
    if isinstance(turns, int):
        otel_verl.set_trajectory_attribute(semconv.ROLLOUT_NUM_TURNS, turns)
        outcome["num_turns"] = turns
    ids = getattr(result, "response_ids", None)
    if isinstance(ids, list):
        outcome["response_length"] = len(ids)
        mask = getattr(result, "response_mask", None)
        if isinstance(mask, list) and len(mask) == len(ids):
            outcome["generated_tokens"] = sum(1 for m in mask if m)
        tokenizer = _RUN_TOKENIZER.get()
        if tokenizer is not None and otel_verl.RolloutTraceConfig.enable_token2text():
            # the whole multi-turn response (model turns and tool results), decoded once per
            # traced trajectory; the payload cap applies to it like to any captured value
            outcome["response"] = tokenizer.decode(ids, skip_special_tokens=False)
    if outcome:
        otel_verl.set_trajectory_output(**outcome)


# --- AgentLoopWorker -----------------------------------------------------------------------------


def patch_agent_loop(module: ModuleType) -> None:
    """Post-import hook of verl's agent-loop module."""
    with LOCK:
        worker = getattr(module, "AgentLoopWorker", None)
        if not S.installed or worker is None or getattr(worker, MARK, False):
            return
        generate = worker.__dict__.get("generate_sequences")
        if inspect.iscoroutinefunction(generate):
            set_attr(worker, "generate_sequences", _sampling_generate_sequences(generate))
            S.sampler_patched = True
            S.undo.append(lambda: setattr(S, "sampler_patched", False))
        else:
            _log.warning("otel_verl: AgentLoopWorker.generate_sequences not found or not async; "
                         "verl's own (random) trace sampling stays in effect")
        score = worker.__dict__.get("_compute_score")
        params = list(inspect.signature(score).parameters) if callable(score) else []
        if inspect.iscoroutinefunction(score) and params == ["self", "outputs", "kwargs"]:
            set_attr(worker, "_compute_score", _traced_compute_score(score))
        else:
            _log.warning("otel_verl: AgentLoopWorker._compute_score has an unknown signature %s "
                         "(verl version not supported for reward spans); reward is not traced",
                         params)
        # warn once per unknown subclass that runs samples its own way
        for_each_subclass(worker, _check_worker_class, "verl trainer check")
        set_attr(worker, MARK, True)


def _check_worker_class(cls: type) -> None:
    if "__ray_actor_class__" in vars(cls) or cls.__name__.startswith("ActorClass("):
        return  # Ray's own subclasses of a @ray.remote class
    if (cls.__module__, cls.__name__) in KNOWN_WORKERS:
        return
    overridden = [name for name in _RUN_METHODS if name in vars(cls)]
    if overridden:
        warn_once(f"worker:{cls.__module__}.{cls.__qualname__}",
                  "otel_verl: %s.%s overrides AgentLoopWorker.%s: otel_verl does not know this "
                  "trainer's agent-loop worker, so its rollouts are traced only where it passes "
                  "trace=True to rollout_trace_attr (no deterministic sampling, no rollout_n fix); "
                  "verl 0.9's legacy trainer (trainer.use_v1=False) and v1 trainer "
                  "(AgentLoopWorkerTQ) are the ones traced", cls.__module__, cls.__qualname__,
                  "/".join(overridden))


def _batch_indices(batch: Any) -> list[Any]:
    """The dataset sample index of every row of a worker's chunk (``DataProto``)."""
    index = batch.non_tensor_batch.get("index")
    return index.tolist() if index is not None else list(range(len(batch)))


def _tensordict_indices(batch: Any) -> list[Any]:
    """The same for the v1 trainer's chunk (a ``TensorDict``; ``index`` a tensor or a stack)."""
    if "index" not in batch:
        return list(range(len(batch)))
    index = batch["index"]
    values = index.tolist() if hasattr(index, "tolist") else list(index)
    return [getattr(v, "data", v) for v in values]


@contextlib.contextmanager
def _selected(indices_of: Callable[[Any], list[Any]], batch: Any) -> Iterator[None]:
    """``SELECTION`` set for this chunk while inside, when a per-step sample limit is configured
    (asyncio tasks created inside copy it)."""
    token: contextvars.Token | None = None
    if S.active():
        try:
            sampler = otel_verl.RolloutTraceConfig.sampler()
            if sampler.limit is not None:
                token = SELECTION.set(sampler.select(norm(i) for i in indices_of(batch)))
        except Exception as exc:
            _errors.internal_error(exc, "verl trace sampling")
    try:
        yield
    finally:
        if token is not None:
            SELECTION.reset(token)


def _sampling_generate_sequences(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def generate_sequences(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with _selected(_batch_indices, batch):
                return await original(self, batch, *args, **kwargs)
        finally:
            flush_content_soon()

    return generate_sequences


def flush_content_soon() -> None:
    """Write this process's buffered per-turn content nodes out, on a worker thread (never
    awaited: the event loop does not wait for the disk).

    verl's Ray actors are ended without exit hooks when training stops, so the content store
    (``<trace_dir>/content/``, written by a background thread through a buffered file) is
    flushed after each chunk of rollouts (legacy trainer) and each trajectory (v1 trainer), as the
    spans themselves are exported as they end.
    """
    if not S.active():
        return
    try:
        from otel_verl import _content

        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, functools.partial(_content.flush_all, 2.0))
    except Exception as exc:  # no running loop, an executor shut down: the next flush will do
        _errors.internal_error(exc, "content store flush")


# --- the v1 trainer's worker (AgentLoopWorkerTQ) ------------------------------------------------


def _actor_class(obj: Any) -> Any:
    """The class behind a ``@ray.remote`` class (verl decorates ``AgentLoopWorkerTQ`` itself)."""
    modified = _ray_class(obj)
    return getattr(modified, "__ray_actor_class__", modified) if modified is not None else obj


def _ray_class(obj: Any) -> type | None:
    """Ray's subclass behind a ``@ray.remote`` class: the class a Ray actor really runs.

    Ray copies every method onto it (wrapped for Ray's own tracing) when the decorator runs, so a
    change to the user's class afterwards does not reach the actor; it has to be made here too.
    """
    modified = getattr(getattr(obj, "__ray_metadata__", None), "modified_class", None)
    return modified if isinstance(modified, type) else None


def patch_agent_loop_tq(module: ModuleType) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.agent_loop_tq`` (verl's v1 trainer)."""
    with LOCK:
        remote = getattr(module, "AgentLoopWorkerTQ", None)
        cls = _actor_class(remote)
        if not S.installed or not isinstance(cls, type) or vars(cls).get(MARK, False):
            return
        generate = cls.__dict__.get("generate_sequences")
        run = getattr(cls, "_run_agent_loop", None)
        run_params = list(inspect.signature(run).parameters) if callable(run) else []
        if not (inspect.iscoroutinefunction(generate) and inspect.iscoroutinefunction(run)
                and run_params[:3] == ["self", "sampling_params", "trajectory"]
                and "trace" in run_params):
            warn_once("worker:v1", "otel_verl: verl's v1 trainer worker (AgentLoopWorkerTQ in "
                      "%s) is not the one of verl 0.9 (generate_sequences/_run_agent_loop "
                      "differ): rollouts of trainer.use_v1=True are NOT traced; "
                      "trainer.use_v1=False is", AGENT_LOOP_TQ_MODULE)
            return
        # the class itself (used directly, e.g. by tests), then Ray's copy of it (what the actor
        # runs; its methods are Ray's wrappers of verl's, which ours wrap in turn)
        for target in (cls, _ray_class(remote)):
            if target is None:
                continue
            own_generate = target.__dict__.get("generate_sequences", generate)
            own_run = target.__dict__.get("_run_agent_loop", run)
            set_attr(target, "generate_sequences",
                     _as_method_of(cls, _tq_generate_sequences(own_generate)))
            set_attr(target, "_run_agent_loop", _as_method_of(cls, _tq_run_agent_loop(own_run)))
            set_attr(target, MARK, True)


def _as_method_of(cls: type, func: Callable[..., Any]) -> Callable[..., Any]:
    """Name a wrapper as a method of ``cls`` (what verl's logs and Ray's method table show)."""
    func.__module__ = cls.__module__
    func.__qualname__ = f"{cls.__qualname__}.{func.__name__}"
    setattr(func, MARK, True)
    return func


# Ray pickles the actor's class by value (the module's name is bound to the ``@ray.remote``
# object, not to the class), our wrappers with it. Their code therefore names nothing but this
# module (pickled by reference, so the worker uses its own state) and the wrapped function.
_THIS = sys.modules[__name__]


def _tq_generate_sequences(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def generate_sequences(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return await _THIS.tq_generate_sequences(original, self, batch, *args, **kwargs)

    return generate_sequences


def _tq_run_agent_loop(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _run_agent_loop(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await _THIS.tq_run_agent_loop(original, self, *args, **kwargs)

    return _run_agent_loop


async def tq_generate_sequences(original: Callable[..., Any], worker: Any, batch: Any,
                                *args: Any, **kwargs: Any) -> Any:
    """``AgentLoopWorkerTQ.generate_sequences`` with otel_verl's sample selection."""
    # the background tasks verl creates in there copy this context, the selection included
    with _selected(_tensordict_indices, batch):
        return await original(worker, batch, *args, **kwargs)


async def tq_run_agent_loop(original: Callable[..., Any], worker: Any, sampling_params: Any,
                            trajectory: Any, *args: Any, **kwargs: Any) -> Any:
    """``AgentLoopWorkerTQ._run_agent_loop`` traced: ``trace`` on, ``rollout_n`` = session id."""
    if S.active():
        # verl 0.9.1 passes trace=False here (a TODO in verl); the facade's rollout_trace_attr
        # applies otel_verl's sampler instead
        kwargs["trace"] = True
        session = kwargs.get("session_id")
        if isinstance(trajectory, dict) and session is not None:
            trajectory = {**trajectory, "rollout_n": norm(session)}
    try:
        return await original(worker, sampling_params, trajectory, *args, **kwargs)
    finally:
        flush_content_soon()


# --- reward --------------------------------------------------------------------------------------


def _traced_compute_score(original: Callable[..., Any]) -> Callable[..., Any]:
    span_name = original.__qualname__

    @functools.wraps(original)
    async def _compute_score(self: Any, outputs: Any, kwargs: Any) -> Any:
        if not (S.active() and otel_verl.is_recording()) or not outputs:
            return await original(self, outputs, kwargs)
        final = outputs[-1]
        computed_here = (getattr(final, "reward_score", None) is None
                         and getattr(self, "reward_loop_worker_handles", None) is not None)
        if not computed_here:  # no reward here, or the agent loop already computed it
            result = await original(self, outputs, kwargs)
            _record(final)
            return result
        parent = otel_trace.get_current_span()
        attrs: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: SpanKindName.EVALUATOR,
                                 semconv.GEN_AI_OPERATION_NAME: GenAIOperation.EVALUATE,
                                 semconv.GEN_AI_EVALUATION_NAME: "reward"}
        parent_attrs = getattr(parent, "attributes", None)  # SDK spans have them, others not
        if parent_attrs and parent_attrs.get(semconv.OTEL_VERL_TRAJECTORY):
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
    _parity.record_consumed(final)  # what the trainer batches, as content ids (off the loop)
    score = getattr(final, "reward_score", None)
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        otel_verl.record_reward(score)
