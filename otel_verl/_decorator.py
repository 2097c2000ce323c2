"""``rollout_trace_op``: one span per call of a traced function (sync, async, generator, async
generator), named by its qualname, with inputs and output captured by ``otel_verl._capture``.

Usage::

    class MyAgentLoop:
        @rollout_trace_op                                   # verl's form
        async def run(self, sampling_params, **row): ...

    @rollout_trace_op(kind=SpanKindName.TOOL, name="calculator")
    def calc(expression: str) -> str: ...

    traced = rollout_trace_op(fn, name="Engine.generate", kind=SpanKindName.LLM,
                              before=add_request_attrs, after=add_usage)   # integrations

One core (``_OpSpec`` for what a function needs, ``_OpCall`` for one recorded call) behind four
thin adapters that differ only in the shape of the call. Wrappers hold no closures over
unpicklable state, so Ray can ship decorated functions with cloudpickle.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry.trace import Span, SpanKind

from otel_verl import _errors, _policy, semconv
from otel_verl._capture import (
    UNSET,
    PendingRefs,
    as_dict,
    payload_attrs,
    record_failure,
    set_payload,
    settle_inputs,
    settle_refs,
    token_texts,
    track_refs,
)
from otel_verl._hotpath import (
    attach_span,
    attribute_map,
    cleaned,
    is_current,
    merge_clean,
    start_span,
)
from otel_verl._hotpath import detach as detach_context
from otel_verl._state import STATE, TRAJECTORY, Runtime
from otel_verl._trajectory import Outcome
from otel_verl.exporters._scrub import fix_surrogates

P = ParamSpec("P")
R = TypeVar("R")

#: ``before(owner, kwargs)``: runs inside the op's span just before the call (``owner`` is the
#: first positional argument, e.g. ``self``, or None); it may add attributes to the current span
#: and change ``kwargs`` (what the function receives; the recorded input is taken before).
BeforeHook = Callable[[Any, dict[str, Any]], None]
#: ``after(result)``: runs inside the op's span after a successful call (sync and async).
AfterHook = Callable[[Any], None]

_MAX_YIELDS_KEPT = 1000

#: the ``openinference.span.kind`` of an op whose kind is not given, by the method's name: verl's
#: traced methods (the per-turn LLM client ``generate``, a tool's ``execute``, an agent loop's
#: ``run``), as the verl integration classifies them; anything else is a CHAIN
KIND_BY_METHOD_NAME: Mapping[str, str] = {
    "generate": semconv.SpanKindName.LLM,
    "execute": semconv.SpanKindName.TOOL,
    "run": semconv.SpanKindName.AGENT,
}


def default_kind(fn: Callable[..., Any]) -> str:
    """The kind ``rollout_trace_op`` gives ``fn`` when none is given (see ``KIND_BY_METHOD_NAME``)."""
    name = getattr(fn, "__name__", None)
    return KIND_BY_METHOD_NAME.get(name, semconv.SpanKindName.CHAIN) if type(name) is str else \
        semconv.SpanKindName.CHAIN


class _OpSpec:
    """What one decorated function needs at call time (picklable: no closures, no locks)."""

    __slots__ = ("fn", "name", "kind", "capture_input", "capture_output", "names", "has_self",
                 "defaults", "simple", "signature", "before", "after", "span_kind", "varkw",
                 "fixed", "positional")

    def __init__(self, fn: Callable[..., Any], name: str | None, kind: str | None,
                 capture_input: bool, capture_output: bool, before: BeforeHook | None = None,
                 after: AfterHook | None = None,
                 span_kind: SpanKind = SpanKind.INTERNAL) -> None:
        self.fn = fn
        self.span_kind = span_kind
        self.name: str = fix_surrogates(
            name or str(getattr(fn, "__qualname__", getattr(fn, "__name__", "op"))))
        self.kind = kind if kind is not None else default_kind(fn)
        self.capture_input = capture_input
        self.capture_output = capture_output
        self.before = before
        self.after = after
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        params = list(self.signature.parameters.values()) if self.signature else []
        self.names = tuple(p.name for p in params)
        self.has_self = bool(params) and params[0].name in ("self", "cls")
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.simple = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        # ``(self, a, *, b, **kwargs)``: bound without ``Signature.bind`` (``_bind_varkw``)
        self.varkw: str | None = None
        self.fixed: tuple[str, ...] = ()
        self.positional = 0
        if params and params[-1].kind is params[-1].VAR_KEYWORD and all(
                p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params[:-1]):
            self.varkw = params[-1].name
            self.fixed = self.names[:-1]
            self.positional = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)

    def __getstate__(self) -> dict[str, Any]:
        return {slot: getattr(self, slot) for slot in self.__slots__ if slot != "signature"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.span_kind = SpanKind.INTERNAL  # a spec pickled before span_kind existed
        self.varkw, self.fixed, self.positional = None, (), 0  # ... or before varkw
        for key, value in state.items():
            setattr(self, key, value)
        try:
            self.signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            self.signature = None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(self or None, inputs without self), like verl: defaults applied, **kwargs as one key."""
        if self.simple and len(args) <= len(self.names):
            inputs = dict(zip(self.names, args, strict=False))
            inputs.update(kwargs)
            for key, value in self.defaults.items():
                inputs.setdefault(key, value)
        elif self.varkw is not None and len(args) <= self.positional and \
                (bound_varkw := self._bind_varkw(args, kwargs)) is not None:
            inputs = bound_varkw
        elif self.signature is not None:
            try:
                bound = self.signature.bind(*args, **kwargs)
                bound.apply_defaults()
                inputs = dict(bound.arguments)
            except TypeError:  # the call itself will raise the real error
                inputs = {"args": list(args), "kwargs": kwargs}
        else:
            inputs = {"args": list(args), "kwargs": kwargs}
        owner = None
        if self.has_self and self.names and self.names[0] in inputs:
            owner = inputs.pop(self.names[0])
        return owner, inputs

    def _bind_varkw(self, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """``Signature.bind`` + ``apply_defaults`` for ``(a, *, b, **kwargs)`` (parameter order,
        the extra keywords as one dict, in call order); None where that would raise."""
        inputs: dict[str, Any] = {}
        count = len(args)
        for index, name in enumerate(self.fixed):
            if index < count:
                if name in kwargs:  # given twice
                    return None
                inputs[name] = args[index]
            elif name in kwargs:
                inputs[name] = kwargs[name]
            elif name in self.defaults:
                inputs[name] = self.defaults[name]
            else:  # missing
                return None
        inputs[self.varkw] = {k: v for k, v in kwargs.items() if k not in inputs}  # type: ignore[index]
        return inputs


class _OpCall:
    """One recorded call of a traced function: start, then exactly one of ``end`` or ``fail``.

    The single core behind the four adapters (sync, async, generator, async generator). Every
    step that is otel_verl's own work is guarded: a bug here is logged, the user's call goes on.
    """

    __slots__ = ("lazy", "outcome", "owner", "refs", "runtime", "span", "spec", "token")

    def __init__(self, spec: _OpSpec, runtime: Runtime, span: Span, owner: Any,
                 token: Any, outcome: Outcome | None = None) -> None:
        self.spec, self.runtime, self.span, self.owner, self.token = (spec, runtime, span, owner,
                                                                      token)
        #: the trajectory's outcome, for a top-level op (its input and output may show there)
        self.outcome = outcome
        #: inputs captured ``lazy`` (``settle`` before the call's caller goes on)
        self.lazy = False
        #: references of the inputs named by placeholders until ``settle`` (a dataset prompt
        #: hashed off the loop), else None
        self.refs: PendingRefs | None = None

    @classmethod
    def begin(cls, spec: _OpSpec, args: tuple[Any, ...],
              kwargs: dict[str, Any], lazy: bool = False) -> _OpCall | None:
        """Start the span (current from now on), capture inputs and run the ``before`` hook;
        None when not recording.

        ``lazy`` (a plain function or coroutine: its caller does not run until it returns):
        the prompt's O(context) work is left to the content thread, settled when the call ends
        (``settle``); a generator's caller runs between its items, so it is never lazy."""
        runtime = STATE.runtime
        if runtime is None:
            return None
        traj = TRAJECTORY.get()
        if traj is not None and not traj.enabled:
            return None
        try:
            # the trajectory attributes (and the child marker) are added at start, validated
            # once per trajectory, by the provider's TrajectoryAttributesProcessor
            attrs: dict[str, Any] = {semconv.OPENINFERENCE_SPAN_KIND: spec.kind}
            if spec.kind == semconv.SpanKindName.LLM:
                _policy.start_attributes(attrs)  # rl.policy.version (O(1))
            outcome = None
            if traj is not None and traj.span is not None and is_current(traj.span):
                outcome = traj.outcome  # (``current_outcome()``: traj is the current one)
            owner = None
            captured = spec.capture_input and runtime.config.capture_payloads
            pending = None
            if captured:
                owner, inputs = spec.bind(args, kwargs)
                pending = PendingRefs() if lazy else None
                attrs.update(payload_attrs(runtime, inputs, UNSET, {}, lazy, pending))
            elif spec.has_self and args:
                owner = args[0]
            if outcome is not None:
                outcome.op_started(spec.name, attrs.get(semconv.INPUT_VALUE),
                                   spec.kind == semconv.SpanKindName.AGENT)
            # started bare, then the op's attributes in one insert (validated here once, not
            # re-checked by the SDK through its ABC dispatch): samplers and on_start hooks see
            # the trajectory attributes (TrajectoryAttributesProcessor), not the op's own
            span = start_span(runtime.tracer, spec.name, spec.span_kind)  # a LightSpan
            merge_clean(span, cleaned(attrs))  # attrs: this call's own dict
            token = attach_span(span)
        except Exception as exc:
            _errors.internal_error(exc, f"starting span {spec.name}")
            return None
        call = cls(spec, runtime, span, owner, token, outcome)
        call.lazy = lazy and captured
        if pending is not None and pending.refs:
            call.refs = pending
            track_refs(span, pending)  # (named by their ids in a stuck op's live record)
        if spec.before is not None and args:
            try:
                spec.before(args[0], kwargs)
            except Exception as exc:
                _errors.internal_error(exc, f"before-hook of {spec.name}")
        return call

    def settle(self) -> None:
        """The inputs' work left to the content thread, settled on the span (``lazy``; O(1) when
        that thread has done it): before the call's caller goes on, or token2text reads it."""
        if self.lazy:
            self.lazy = False
            settle_inputs(self.span)
            if self.refs is not None:
                refs, self.refs = self.refs, None
                settle_refs(self.span, refs, self.outcome)

    def detach(self) -> None:
        """Stop being the current span (generators re-enter with ``step_context``)."""
        if self.token is not None:
            detach_context(self.token)
            self.token = None

    def step_context(self) -> Any:
        """Make the span current for one step of a generator; detach the returned token."""
        return attach_span(self.span)

    def run_after(self, result: Any) -> None:
        """The ``after`` hook, while the span is still current (never raises)."""
        if self.spec.after is not None:
            try:
                self.spec.after(result)
            except Exception as exc:
                _errors.internal_error(exc, f"after-hook of {self.spec.name}")

    def wants_text(self) -> bool:
        """token2text applies: on, capturing, and the owner has a ``tokenizer`` (never raises:
        an owner whose ``__getattr__`` raises has none)."""
        config = self.runtime.config
        if not (config.token2text and config.capture_payloads and self.spec.capture_output):
            return False
        try:
            return getattr(self.owner, "tokenizer", None) is not None
        except Exception:  # the owner's own code raised: no text, the call's result stands
            return False

    def texts(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> dict[str, str] | None:
        """token2text: decoded prompt/response text (never raises)."""
        try:
            return token_texts(self.owner, kwargs, output, self.span)
        except Exception as exc:
            _errors.internal_error(exc, f"token2text in {self.spec.name}")
            return None

    def end(self, output: Any, extra: Mapping[str, Any] | None = None) -> None:
        self.detach()
        self.settle()
        try:
            if self.spec.capture_output:
                value = dict(as_dict(output), **extra) if extra else output
                set_payload(self.span, output=value)
                if self.outcome is not None and not self.outcome.output_set:
                    self.outcome.op_ended(attribute_map(self.span).get(semconv.OUTPUT_VALUE),
                                          self.spec.kind == semconv.SpanKindName.AGENT)
            self.span.end()
        except Exception as exc:
            _errors.internal_error(exc, f"finishing span {self.spec.name}")

    def fail(self, exc: BaseException) -> None:
        self.detach()
        self.settle()
        record_failure(self.span, exc)
        self.span.end()


# the four adapters: only the shape of the call differs ------------------------------------------


def _sync_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs, lazy=True)
        if call is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.settle()
        call.run_after(result)
        call.end(result, call.texts(args, kwargs, result) if call.wants_text() else None)
        return result

    return wrapper


def _async_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs, lazy=True)
        if call is None:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.settle()
        call.run_after(result)
        extra = None
        if call.wants_text():  # decoding can take milliseconds: off the event loop's thread
            call.detach()
            extra = await asyncio.get_running_loop().run_in_executor(
                None, call.texts, args, kwargs, result)
        call.end(result, extra)
        return result

    return wrapper


def _gen_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:
            return (yield from fn(*args, **kwargs))
        call.detach()  # the span is current only while the generator's own code runs
        gen = fn(*args, **kwargs)
        items: list[Any] = []
        to_send: Any = None
        pending: BaseException | None = None
        while True:
            token = call.step_context()
            try:
                item = gen.throw(pending) if pending is not None else gen.send(to_send)
            except StopIteration as stop:
                detach_context(token)
                call.end(items if stop.value is None else stop.value)
                return stop.value
            except BaseException as exc:
                detach_context(token)
                call.fail(exc)
                raise
            detach_context(token)
            pending = None
            if len(items) < _MAX_YIELDS_KEPT:
                items.append(item)
            try:
                to_send = yield item
            except GeneratorExit:
                try:
                    gen.close()  # raises RuntimeError if it ignores GeneratorExit, as untraced
                finally:
                    call.end(items)
                raise
            except BaseException as exc:  # thrown in by the caller: forward it to the generator
                pending, to_send = exc, None

    return wrapper


def _async_gen_wrapper(spec: _OpSpec) -> Callable[..., Any]:
    fn = spec.fn

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call = _OpCall.begin(spec, args, kwargs)
        if call is None:  # still forward asend/athrow/aclose, as the traced path does
            agen = fn(*args, **kwargs)
            to_send: Any = None
            pending: BaseException | None = None
            while True:
                try:
                    item = await (agen.athrow(pending) if pending is not None else
                                  agen.asend(to_send))
                except StopAsyncIteration:
                    return
                pending = None
                try:
                    to_send = yield item
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as exc:
                    pending, to_send = exc, None
        call.detach()
        agen = fn(*args, **kwargs)
        items: list[Any] = []
        to_send = None
        pending = None
        while True:
            token = call.step_context()
            try:
                item = await (agen.athrow(pending) if pending is not None else
                              agen.asend(to_send))
            except StopAsyncIteration:
                detach_context(token)
                call.end(items)
                return
            except BaseException as exc:
                detach_context(token)
                call.fail(exc)
                raise
            detach_context(token)
            pending = None
            if len(items) < _MAX_YIELDS_KEPT:
                items.append(item)
            try:
                to_send = yield item
            except GeneratorExit:
                try:
                    await agen.aclose()
                finally:
                    call.end(items)
                raise
            except BaseException as exc:  # thrown in by the caller: forward it to the generator
                pending, to_send = exc, None

    return wrapper


@overload
def rollout_trace_op(func: Callable[P, R], /, *, name: str | None = None,
                     kind: str | None = None, capture_input: bool = True,
                     capture_output: bool = True, before: BeforeHook | None = None,
                     after: AfterHook | None = None,
                     span_kind: SpanKind = SpanKind.INTERNAL) -> Callable[P, R]: ...


@overload
def rollout_trace_op(func: None = None, /, *, name: str | None = None,
                     kind: str | None = None, capture_input: bool = True,
                     capture_output: bool = True, before: BeforeHook | None = None,
                     after: AfterHook | None = None,
                     span_kind: SpanKind = SpanKind.INTERNAL
                     ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def rollout_trace_op(func: Callable[..., Any] | None = None, /, *, name: str | None = None,
                     kind: str | None = None, capture_input: bool = True,
                     capture_output: bool = True, before: BeforeHook | None = None,
                     after: AfterHook | None = None,
                     span_kind: SpanKind = SpanKind.INTERNAL) -> Any:
    """Trace a function or method as one span (sync, async, generator or async generator).

    Bare (``@rollout_trace_op``, as in verl), with options (``@rollout_trace_op(kind=...)``), or
    called on a function (``rollout_trace_op(fn, name=..., kind=...)``).

    Args:
        func: the function (bare use or a direct call).
        name: the span name; default the function's ``__qualname__`` (e.g. ``ToolAgentLoop.run``).
        kind: the ``openinference.span.kind`` (``SpanKindName.LLM``, ``TOOL``, ...); default by
            verl's method names: ``generate`` LLM (so Weave's Threads view gets its turns),
            ``execute`` TOOL, ``run`` AGENT, anything else CHAIN (``KIND_BY_METHOD_NAME``).
        capture_input: record the bound arguments (minus ``self``) as ``input.value``.
        capture_output: record the return value as ``output.value``.
        before: ``before(owner, kwargs)`` inside the span, before the call (see ``BeforeHook``).
        after: ``after(result)`` inside the span, after a successful sync or async call.
        span_kind: the OpenTelemetry span kind; ``SpanKind.CLIENT`` for a call to a remote
            service whose span the service continues (an LLM client's ``generate``).

    Returns:
        The wrapped function; with tracing off or silenced it calls straight through (hooks too
        are skipped then).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = _OpSpec(fn, name, kind, capture_input, capture_output, before, after, span_kind)
        if inspect.isasyncgenfunction(fn):
            return _async_gen_wrapper(spec)
        if inspect.iscoroutinefunction(fn):
            return _async_wrapper(spec)
        if inspect.isgeneratorfunction(fn):
            return _gen_wrapper(spec)
        return _sync_wrapper(spec)

    if func is not None:
        return decorate(func)
    return decorate
