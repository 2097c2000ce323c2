"""Tail sampling: decide when a trajectory ends whether to export it, on top of the head decision.

The head rule (``max_samples_per_step_per_worker``, ``otel_verl._sampling``) decides before a
trajectory runs. With ``tail_keep`` set, a trajectory the head rule did not pick (``trace=False``)
is still recorded, provisionally: its spans wait here, in memory, until it ends, and it is exported
when a keep rule matches:

- ``errors``: the trajectory span or any span in it ended with status ERROR or carries
  ``error.type`` (tools that return an error result set it);
- ``truncated``: a model turn finished with ``length`` (``gen_ai.response.finish_reasons``) or the
  agent loop ended on a length or turn limit (``rollout.termination``);
- ``reward_outliers``: its reward (``rollout.reward``, set by ``record_reward``) is unlike its GRPO
  group's: the minority outcome of a mixed group of binary rewards (every reward 0/1 or -1/1; on a
  tie both outcomes are kept), else at least ``tail_reward_z`` standard deviations from the mean;
- ``groups``: when any rollout of a group is kept by a rule above, the whole group is kept.

The rules are policies (``otel_verl.exporters._tail_policy``): pure functions over a finished
trajectory and its group that return a reason and a weight. Pass your own with ``policies=``.
This processor is the mechanism: it buffers, asks the policies, and applies their decisions
(budget, export, counts, the report).

A group is (experiment, validate, step, sample_index) **on this worker**: it is decided when
``group_size`` of its trajectories have ended here, or when its step is over on this worker (a
trajectory of another step started and none of its own is running), after
``tail_group_timeout_s``, or at a flush. Rollouts of one sample spread over several workers form
one group per worker (verl's agent-loop workers receive whole groups, so this is rare there).

Every exported trajectory span carries ``rollout.sampling.reason`` and ``rollout.sampling.weight``
(1 for tail rules; the head rule's weight is set when the trajectory starts). Each worker emits,
per step, a small root span ``otel_verl.sampling_report`` with how many trajectories ended
(``rollout.sampling.ran``), were kept per reason (``rollout.sampling.kept.<reason>``) and were
dropped; reports are increments (a step can get several, e.g. one per flush): sum them.

Cost: spans of an undecided trajectory are held in a buffer bounded in (estimated) bytes,
``tail_buffer_bytes``, each as a compact copy (``otel_verl._hotpath.compact``: about 3 objects
the cyclic GC tracks rather than the SDK's 11, so waiting spans bring the next young collection
little closer). When it is full, the oldest undecided trajectory is exported early rather
than dropped (reason ``overflow``, weight 0: not part of the sample; counted). A trajectory that is
neither head- nor tail-kept costs its capture and is then discarded,
its content-store nodes with it (``otel_verl._content_store.hold``/``release``: held until
the decision, written only for a kept one). ``tail_max_per_step_per_worker``
caps what the tail rules add per step (the rest counted as ``over_budget``).

Usage (``otel_verl._provider`` does this when ``tail_keep`` is set)::

    processor = TailSamplingProcessor(BoundedBatchProcessor(exporter), keep=("errors",),
                                      group_size=8, resource=provider.resource,
                                      policies=[my_policy])  # optional: your own rules
    provider.add_span_processor(processor)
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from otel_verl import _content_store, _errors, semconv
from otel_verl._config import TraceConfig
from otel_verl._fork import LiveInstances
from otel_verl._hotpath import attribute_map, compact
from otel_verl.exporters._spans import copy_span, shutdown_within
from otel_verl.exporters._tail_policy import (
    RULES,
    GroupKey,
    GroupView,
    KeepDecision,
    Policy,
    StepKey,
    TailPolicy,
    TrajectoryView,
    builtin_policies,
    group_view,
    reward_outliers,
)
from otel_verl.semconv import SamplingReason

__all__ = [
    "RULES",
    "GroupView",
    "KeepDecision",
    "Policy",
    "TailPolicy",
    "TailSamplingProcessor",
    "TrajectoryView",
    "reward_outliers",
    "span_bytes",
]

_log = logging.getLogger(__name__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: bytes of a finished SDK span with no attributes (its BoundedAttributes with a lock, context,
#: status, ...) and of one event, measured with tracemalloc (opentelemetry-sdk 1.45, CPython 3.11)
_SPAN_OVERHEAD = 2600
_EVENT_OVERHEAD = 600
_ATTRIBUTE_OVERHEAD = 80  # a dict slot, the value object's header
_MAX_STEPS_KEPT = 64
_MAX_CLOSED_GROUPS = 4096
_TRUNCATING_TERMINATIONS = frozenset(semconv.TRUNCATING_TERMINATIONS)
_TRUNCATING_FINISH = frozenset(semconv.TRUNCATING_FINISH_REASONS)
_NO_ATTRIBUTES: Mapping[str, Any] = {}


def _attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes for reading: the SDK's own dict where it holds one (no read-only
    proxy made per call); never handed to a policy (``TrajectoryView`` gets a proxy)."""
    return attribute_map(span) or _NO_ATTRIBUTES


def _step_key(attributes: Mapping[str, Any]) -> StepKey:
    """(experiment, validate, step) of a trajectory span."""
    return (attributes.get(semconv.ROLLOUT_EXPERIMENT_NAME),
            bool(attributes.get(semconv.ROLLOUT_VALIDATE)), attributes.get(semconv.ROLLOUT_STEP))


def span_bytes(span: ReadableSpan) -> int:
    """An estimate of what a finished span holds in memory: a fixed overhead per span, attribute
    and event, plus the length of every string (one pass, no call per value)."""
    attributes = _attributes(span)
    size = _SPAN_OVERHEAD + len(span.name)
    if attributes:
        size += _ATTRIBUTE_OVERHEAD * len(attributes)
        value: Any
        for value in attributes.values():
            kind = type(value)
            if kind is str:
                size += len(value)
            elif kind is tuple or kind is list:
                size += 8 * len(value) + sum(len(v) for v in value if type(v) is str)
    if not getattr(span, "_events", True):  # no events: skip the SDK's copy into a tuple
        return size
    for event in span.events:
        size += _EVENT_OVERHEAD
        event_attributes: Mapping[str, Any] = event.attributes or _NO_ATTRIBUTES
        size += _ATTRIBUTE_OVERHEAD * len(event_attributes) + sum(
            len(v) for v in event_attributes.values() if type(v) is str)
    return size


class _Undecided:
    """A provisionally recorded trajectory: its buffered spans and what the rules look at."""

    __slots__ = (
        "bytes",
        "error",
        "group",
        "head_weight",
        "reason",
        "reward",
        "root",
        "span_id",
        "spans",
        "spilled",
        "step",
        "truncated",
        "verdict",
        "view",
    )

    def __init__(self, span_id: int, step: StepKey, group: GroupKey,
                 head_weight: float | None = None) -> None:
        self.span_id = span_id
        #: set for a head-sampled trajectory: its spans go out at once, only its weight waits
        self.head_weight = head_weight
        self.step = step
        self.group = group
        self.spans: list[ReadableSpan] = []
        self.bytes = 0
        self.error = False
        self.truncated = False
        self.root: ReadableSpan | None = None
        self.reward: float | None = None
        self.spilled = False
        self.verdict: bool | None = None  # None: undecided; True: exported; False: dropped
        self.reason: str | None = None
        #: what the policies see, fixed when its trajectory span ends
        self.view: TrajectoryView | None = None

    def kept_reason(self) -> str | None:
        """The reason it was exported with, None while undecided or when dropped."""
        return self.reason if self.verdict else None


class _Group:
    __slots__ = ("members", "since")

    def __init__(self, since: float) -> None:
        self.members: list[_Undecided] = []
        self.since = since


class _Step:
    __slots__ = ("counts", "open", "tail_kept")

    def __init__(self) -> None:
        self.open = 0  # trajectories of this step started and not ended yet
        self.counts: collections.Counter[str] = collections.Counter()  # since the last report
        self.tail_kept = 0  # for the budget: every tail keep of this step, never reset


class _Ledger:
    """The counts: per step (since its last report, and for the budget) and in total; the step
    that runs now; the report spans."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self.steps: dict[StepKey, _Step] = {}
        self.current: StepKey | None = None
        self.counts: collections.Counter[str] = collections.Counter()
        self._resource = resource
        self._scope = scope
        self._ids = RandomIdGenerator()

    def step(self, key: StepKey) -> _Step:
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = _Step()
        return step

    def count(self, step: _Step, what: str, ran: bool = True) -> None:
        step.counts[what] += 1
        self.counts[what] += 1
        if ran:
            step.counts["ran"] += 1
            self.counts["ran"] += 1

    def report(self, key: StepKey, out: list[ReadableSpan]) -> None:
        """The step's counts since its last report as a report span, if there are any."""
        step = self.steps.get(key)
        if step is None or not step.counts:
            return
        counts, step.counts = step.counts, collections.Counter()
        context = SpanContext(self._ids.generate_trace_id(), self._ids.generate_span_id(),
                              is_remote=False, trace_flags=_SAMPLED)
        out.append(report_span(key, counts, context, self._resource, self._scope))
        self.counts["reports"] += 1

    def forget_old_steps(self) -> None:
        if len(self.steps) > _MAX_STEPS_KEPT:
            for old in list(self.steps)[: len(self.steps) - _MAX_STEPS_KEPT]:
                if self.steps[old].open <= 0 and not self.steps[old].counts:
                    del self.steps[old]


def _observe(trajectory: _Undecided, span: ReadableSpan) -> None:
    """What the built-in rules look at in each span: errors and truncation."""
    attributes = _attributes(span)
    if span.status.status_code is StatusCode.ERROR or \
            attributes.get(semconv.ERROR_TYPE) is not None:
        trajectory.error = True
    reasons = attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    if reasons and not isinstance(reasons, str) and any(r in _TRUNCATING_FINISH
                                                        for r in reasons):
        trajectory.truncated = True
    if attributes.get(semconv.ROLLOUT_TERMINATION) in _TRUNCATING_TERMINATIONS:
        trajectory.truncated = True


def _count_flags(ledger: _Ledger, step: _Step, attributes: Mapping[str, Any]) -> None:
    """The detectors' flags on a trajectory span, for the step's report (``flagged.<name>``)."""
    flags = attributes.get(semconv.RL_FLAGS)
    if flags and not isinstance(flags, str):
        for name in flags:
            ledger.count(step, "flagged." + str(name), ran=False)


def _view(trajectory: _Undecided) -> TrajectoryView:
    view = trajectory.view
    if view is None:  # not ended through _root_ended (cannot happen for a group member)
        view = TrajectoryView(_NO_ATTRIBUTES, trajectory.group, trajectory.error,
                              trajectory.truncated, trajectory.reward, trajectory.head_weight)
    return view


def _first(policies: tuple[TailPolicy, ...], view: TrajectoryView, group: GroupView | None,
           counts: collections.Counter[str]) -> KeepDecision | None:
    for policy in policies:
        decision = _ask(policy, view, group, counts)
        if decision is not None:
            return decision
    return None


def _ask(policy: TailPolicy, view: TrajectoryView, group: GroupView | None,
         counts: collections.Counter[str]) -> KeepDecision | None:
    """One policy's decision; one that raises or answers something else has no opinion."""
    try:
        decision = policy.decide(view, group)
    except Exception as exc:
        counts["policy_errors"] += 1
        _POLICY_WARNING.warn("otel_verl: tail policy %s raised %s: %s (treated as no opinion)",
                             policy.name, type(exc).__name__, exc)
        return None
    if decision is None or isinstance(decision, KeepDecision):
        return decision
    counts["policy_errors"] += 1
    _POLICY_WARNING.warn("otel_verl: tail policy %s returned %r, not a KeepDecision or None "
                         "(treated as no opinion)", policy.name, decision)
    return None


class _Buffer:
    """The spans of undecided trajectories, bounded in estimated bytes, and what a decision does
    with a trajectory: export it (reason, weight; within the budget), drop it, or, when the buffer
    is full, export the oldest early."""

    def __init__(self, ledger: _Ledger, max_bytes: int, budget: int | None) -> None:
        self.undecided: dict[int, _Undecided] = {}  # trajectory span id -> it, oldest first
        self.bytes = 0
        self._ledger = ledger
        self._max_bytes = max_bytes
        self._budget = budget

    def abandon_open(self) -> None:
        """Shutdown: the trajectories still running are given up (their spans dropped, counted)."""
        for trajectory in list(self.undecided.values()):
            self._ledger.counts["abandoned_open"] += 1
            _content_store.release(trajectory.span_id, keep=False)
            self.undecided.pop(trajectory.span_id, None)
            self.bytes -= trajectory.bytes
            trajectory.spans, trajectory.bytes, trajectory.verdict = [], 0, False

    def add(self, size: int, out: list[ReadableSpan]) -> None:
        self.bytes += size
        counts = self._ledger.counts
        counts["peak_buffer_bytes"] = max(counts["peak_buffer_bytes"], self.bytes)
        while self.bytes > self._max_bytes and self.undecided:
            self.spill(next(iter(self.undecided.values())), out)

    def spill(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        """The buffer is full: export the oldest undecided trajectory now rather than drop it."""
        self._ledger.counts["spilled"] += 1
        del self.undecided[trajectory.span_id]
        _content_store.release(trajectory.span_id, keep=True)  # its content before its spans
        out.extend(trajectory.spans)
        self.bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        trajectory.spilled = True
        if trajectory.root is not None:  # ended, waiting for its group: decided now
            if trajectory.head_weight is not None:
                self.export(trajectory, SamplingReason.HEAD, trajectory.head_weight, out)
            else:
                self.export(trajectory, SamplingReason.OVERFLOW, 0.0, out)

    def keep(self, trajectory: _Undecided, decision: KeepDecision,
             out: list[ReadableSpan]) -> None:
        if trajectory.head_weight is not None:  # kept by a rule: it would be kept anyway, so
            self.export(trajectory, decision.reason, decision.weight, out)  # the rule's weight
            return
        step = self._ledger.step(trajectory.step)
        if self._budget is not None and step.tail_kept >= self._budget:
            self._ledger.count(step, "over_budget", ran=False)
            self.drop(trajectory, out)
            return
        step.tail_kept += 1
        self.export(trajectory, decision.reason, decision.weight, out)

    def export(self, trajectory: _Undecided, reason: str, weight: float,
               out: list[ReadableSpan]) -> None:
        trajectory.verdict, trajectory.reason = True, reason
        self.undecided.pop(trajectory.span_id, None)
        _content_store.release(trajectory.span_id, keep=True)  # its content before its spans
        out.extend(trajectory.spans)
        if trajectory.root is not None:
            root = trajectory.root  # a finished span cannot change: a copy with the decision
            out.append(copy_span(root, attributes={
                **_attributes(root), semconv.ROLLOUT_SAMPLING_REASON: reason,
                semconv.ROLLOUT_SAMPLING_WEIGHT: weight}))
        self.bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        self._ledger.count(self._ledger.step(trajectory.step), "kept." + reason)

    def drop(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        if trajectory.head_weight is not None:  # no tail rule matches: the head rule's weight
            self.export(trajectory, SamplingReason.HEAD, trajectory.head_weight, out)
            return
        if trajectory.spilled:  # its spans are out already: send its trajectory span too
            self.export(trajectory, SamplingReason.OVERFLOW, 0.0, out)
            return
        trajectory.verdict = False
        self.undecided.pop(trajectory.span_id, None)
        _content_store.release(trajectory.span_id, keep=False)  # its held content discarded
        self.bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        trajectory.root = trajectory.view = None
        self._ledger.count(self._ledger.step(trajectory.step), "dropped")


class _Groups:
    """The groups that wait for their decision (oldest first) and the ones decided already (for
    their stragglers): a group is decided when ``size`` of its trajectories ended, at its step's
    end, after ``timeout_s`` or at a flush, by asking each group policy in turn."""

    def __init__(self, buffer: _Buffer, ledger: _Ledger, policies: tuple[TailPolicy, ...],
                 size: int | None, timeout_s: float, clock: Callable[[], float]) -> None:
        self._buffer = buffer
        self._ledger = ledger
        self._policies = policies
        self._size = size
        self._timeout = timeout_s
        self._clock = clock
        self._waiting: dict[GroupKey, _Group] = {}  # groups not decided yet, oldest first
        self._closed: collections.OrderedDict[GroupKey, bool] = collections.OrderedDict()

    def join(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        key = trajectory.group
        closed = self._closed.get(key)
        if closed is not None:  # a straggler of a group decided already
            if trajectory.verdict is None:
                late = GroupView(key, (), (), late=True, kept_by_rule=closed)
                decision = _first(self._policies, _view(trajectory), late, self._ledger.counts)
                if decision is not None:
                    self._buffer.keep(trajectory, decision, out)
                else:
                    self._buffer.drop(trajectory, out)
            return
        group = self._waiting.get(key)
        if group is None:
            group = self._waiting[key] = _Group(self._clock())
        group.members.append(trajectory)
        if self._size is not None and len(group.members) >= self._size:
            self.decide(key, out)

    def decide(self, key: GroupKey, out: list[ReadableSpan]) -> None:
        """Ask each group policy in turn about the members not kept yet; drop the rest."""
        members = self._waiting.pop(key).members
        views = [_view(m) for m in members]
        for policy in self._policies:
            group = group_view(key, views, [m.kept_reason() for m in members])
            for member, view in zip(members, views, strict=True):
                if member.verdict is None:
                    decision = _ask(policy, view, group, self._ledger.counts)
                    if decision is not None:
                        self._buffer.keep(member, decision, out)
        for member in members:
            if member.verdict is None:
                self._buffer.drop(member, out)
        self._closed[key] = group_view(key, views, [m.kept_reason() for m in members]).kept_by_rule
        if len(self._closed) > _MAX_CLOSED_GROUPS:
            self._closed.popitem(last=False)

    def decide_step(self, step: StepKey, out: list[ReadableSpan]) -> None:
        """Decide the groups of ``step`` that wait (it is over)."""
        for key in [k for k in self._waiting if k[:3] == step]:
            self.decide(key, out)

    def decide_all(self, out: list[ReadableSpan]) -> None:
        for key in list(self._waiting):
            self.decide(key, out)

    def expire(self, out: list[ReadableSpan]) -> None:
        """Decide the groups that have waited longer than ``timeout_s``."""
        if not self._waiting:
            return
        deadline = self._clock() - self._timeout
        while self._waiting:
            key, group = next(iter(self._waiting.items()))
            if group.since > deadline:
                return
            self._ledger.counts["groups_timed_out"] += 1
            self.decide(key, out)


class TailSamplingProcessor(SpanProcessor):
    """Holds spans of provisional trajectories until their tail decision; passes the rest on.

    Args:
        next_processor: the export processor (receives every span that is to be exported).
        keep: the built-in tail rules, a subset of ``RULES``.
        group_size: trajectories per group (GRPO's n); None: groups end only at a step change,
            the timeout or a flush.
        reward_z: the z-score threshold for continuous rewards.
        max_per_step: most trajectories tail rules keep per step (None: no cap).
        buffer_bytes: the buffer for undecided trajectories, in estimated bytes.
        group_timeout_s: an incomplete group is decided after this long.
        resource: the provider's resource (for the report spans).
        clock: monotonic seconds (tests).
        policies: your own policies (functions or ``TailPolicy``), asked after the built-in
            per-trajectory rules and before ``groups`` (``otel_verl.exporters._tail_policy``).
    """

    def __init__(self, next_processor: SpanProcessor, *, keep: Iterable[str],
                 group_size: int | None = None, reward_z: float = 2.0,
                 max_per_step: int | None = None, buffer_bytes: int = 64 * 1024 * 1024,
                 group_timeout_s: float = 300.0, resource: Resource | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 policies: Iterable[Policy] = ()) -> None:
        self.next = next_processor
        self.keep = tuple(keep)
        self.policies = builtin_policies(self.keep, reward_z, policies)
        #: asked when a trajectory ends / when its group is decided
        self._alone = tuple(p for p in self.policies if not p.needs_group)
        self._with_group = tuple(p for p in self.policies if p.needs_group)
        self._grouped = bool(self._with_group)  # trajectories wait for their group
        self._group_size = group_size
        self._budget = max_per_step
        self._max_bytes = buffer_bytes
        self._timeout = group_timeout_s
        self._resource = resource or Resource.get_empty()
        self._scope = InstrumentationScope("otel_verl")
        self._clock = clock
        self._lock = threading.RLock()
        self._reset_state()
        _AFTER_FORK.add(self)

    @classmethod
    def from_config(cls, next_processor: SpanProcessor, config: TraceConfig,
                    resource: Resource | None = None,
                    policies: Iterable[Policy] = ()) -> TailSamplingProcessor:
        """The processor for a resolved configuration (``tail_keep``, ``group_size``, ...)."""
        return cls(next_processor, keep=config.tail_keep, group_size=config.group_size,
                   reward_z=config.tail_reward_z, max_per_step=config.tail_max_per_step_per_worker,
                   buffer_bytes=config.tail_buffer_bytes,
                   group_timeout_s=config.tail_group_timeout_s, resource=resource,
                   policies=policies)

    def _reset_state(self) -> None:
        self._owner: dict[int, _Undecided] = {}  # span id -> its provisional trajectory
        self._ledger = _Ledger(self._resource, self._scope)
        self._buffer = _Buffer(self._ledger, self._max_bytes, self._budget)
        self._groups = _Groups(self._buffer, self._ledger, self._with_group, self._group_size,
                               self._timeout, self._clock)
        self._stopped = False

    # -- the rollout's side ----------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attributes = _attributes(span)
            if attributes.get(semconv.OTEL_VERL_TRAJECTORY):
                with self._lock:
                    released = self._trajectory_started(span, attributes)
                for finished in released:  # a step change can end the previous step's groups
                    self.next.on_end(finished)
            parent = span.parent
            if parent is not None and self._owner:
                owner = self._owner.get(parent.span_id)
                if owner is not None:
                    self._owner[span.context.span_id] = owner
        except Exception as exc:
            _errors.internal_error(exc, "tail sampling on_start")
        self.next.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        out: list[ReadableSpan] = []
        try:
            span_id = span.context.span_id
            owner = self._owner.get(span_id) if self._owner else None
            if owner is None and not _attributes(span).get(semconv.OTEL_VERL_TRAJECTORY):
                self.next.on_end(span)  # not part of a provisional trajectory: straight on
                return
            with self._lock:
                self._owner.pop(span_id, None)
                if owner is None:  # a trajectory span of trace-everything (reason all)
                    self._count_head(span, out)
                    out.insert(0, span)
                elif owner.span_id == span_id:
                    self._root_ended(owner, span, out)
                else:
                    self._child_ended(owner, span, out)
        except Exception as exc:
            _errors.internal_error(exc, "tail sampling on_end")
            if span not in out:
                out.append(span)
        for finished in out:
            self.next.on_end(finished)

    # -- bookkeeping (under the lock) ------------------------------------------------------------
    def _trajectory_started(self, span: Span,
                            attributes: Mapping[str, Any]) -> list[ReadableSpan]:
        step_key = _step_key(attributes)
        step = self._ledger.step(step_key)
        step.open += 1
        provisional = attributes.get(semconv.OTEL_VERL_PROVISIONAL)
        if provisional or attributes.get(semconv.ROLLOUT_SAMPLING_REASON) == SamplingReason.HEAD:
            span_id = span.context.span_id
            weight = attributes.get(semconv.ROLLOUT_SAMPLING_WEIGHT)
            trajectory = _Undecided(
                span_id, step_key, (*step_key, attributes.get(semconv.ROLLOUT_SAMPLE_INDEX)),
                None if provisional else float(weight) if isinstance(weight, (int, float)) else 1.0)
            self._owner[span_id] = trajectory
            if provisional:
                self._buffer.undecided[span_id] = trajectory
                _content_store.hold(span_id)  # its content waits with its spans
        out: list[ReadableSpan] = []
        if step_key != self._ledger.current:  # a step change: steps with nothing running are over
            self._ledger.current = step_key
            for key, other in list(self._ledger.steps.items()):
                if key != step_key and other.open <= 0:
                    self._close_step(key, out)
        return out

    def _close_step(self, key: StepKey, out: list[ReadableSpan]) -> None:
        self._groups.decide_step(key, out)
        self._ledger.report(key, out)
        self._ledger.forget_old_steps()

    def _count_head(self, span: ReadableSpan, out: list[ReadableSpan]) -> None:
        attributes = _attributes(span)
        key = _step_key(attributes)
        step = self._ledger.step(key)
        reason = attributes.get(semconv.ROLLOUT_SAMPLING_REASON) or SamplingReason.ALL
        self._ledger.count(step, "kept." + str(reason))
        _count_flags(self._ledger, step, attributes)
        self._trajectory_ended(key, step, out)

    def _trajectory_ended(self, key: StepKey, step: _Step, out: list[ReadableSpan]) -> None:
        step.open -= 1
        if step.open <= 0 and key != self._ledger.current:
            self._close_step(key, out)
        self._groups.expire(out)

    def _child_ended(self, owner: _Undecided, span: ReadableSpan, out: list[ReadableSpan]) -> None:
        if owner.head_weight is not None:  # head-sampled: exported now, looked at for the rules
            _observe(owner, span)
            out.append(span)
            return
        if owner.verdict is not None or owner.spilled:  # decided, or exported early
            if owner.verdict is False:
                self._ledger.counts["late_spans_dropped"] += 1
            else:
                out.append(span)
            return
        _observe(owner, span)
        # it waits for its trajectory's end: held by ~3 GC-tracked objects instead of ~11 (the
        # SDK's attribute table, bounded lists, deques and locks), which would each count towards
        # the next young collection (that also scans the rollout's fresh token lists)
        span = compact(span)
        size = span_bytes(span)
        owner.spans.append(span)
        owner.bytes += size
        self._buffer.add(size, out)

    def _root_ended(self, trajectory: _Undecided, span: ReadableSpan,
                    out: list[ReadableSpan]) -> None:
        _observe(trajectory, span)
        reward = _attributes(span).get(semconv.ROLLOUT_REWARD)
        if isinstance(reward, (int, float)) and not isinstance(reward, bool) and \
                math.isfinite(reward):
            trajectory.reward = float(reward)
        if self._grouped:  # it may wait for its group: the compact copy (see _child_ended)
            span = compact(span)
        trajectory.root = span
        trajectory.view = TrajectoryView(  # read-only for the policies
            types.MappingProxyType(_attributes(span)), trajectory.group, trajectory.error,
            trajectory.truncated, trajectory.reward, trajectory.head_weight)
        step = self._ledger.step(trajectory.step)
        _count_flags(self._ledger, step, _attributes(span))
        decision = _first(self._alone, trajectory.view, None, self._ledger.counts)
        if decision is not None and trajectory.verdict is None:
            self._buffer.keep(trajectory, decision, out)
        elif not trajectory.spilled and self._grouped:  # it waits for its group: in the buffer
            size = span_bytes(span)
            trajectory.bytes += size
            self._buffer.undecided[trajectory.span_id] = trajectory
            self._buffer.add(size, out)
        if self._grouped:  # kept ones too: their group's rewards and the groups rule need them
            self._groups.join(trajectory, out)
        elif trajectory.verdict is None:
            self._buffer.drop(trajectory, out)
        self._trajectory_ended(trajectory.step, step, out)

    # -- lifecycle -------------------------------------------------------------------------------
    def _decide_all(self, out: list[ReadableSpan], *, abandon_open: bool) -> None:
        """Decide every group that waits (a flush ends them), report every step."""
        self._groups.decide_all(out)
        if abandon_open:
            self._buffer.abandon_open()
        for key in list(self._ledger.steps):
            self._ledger.report(key, out)

    def nudge(self) -> None:
        """Pass the export processor's ``nudge`` on (undecided trajectories stay buffered)."""
        nudge = getattr(self.next, "nudge", None)
        if nudge is not None:
            nudge()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        out: list[ReadableSpan] = []
        try:
            with self._lock:
                self._decide_all(out, abandon_open=False)
        except Exception as exc:
            _errors.internal_error(exc, "tail sampling flush")
        for span in out:
            self.next.on_end(span)
        return self.next.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: int = 10000) -> None:
        out: list[ReadableSpan] = []
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                self._decide_all(out, abandon_open=True)
            except Exception as exc:
                _errors.internal_error(exc, "tail sampling shutdown")
        for span in out:
            self.next.on_end(span)
        shutdown_within(self.next, timeout_millis)

    def stats(self) -> dict[str, int]:
        """The export processor's counts plus ``tail_*``: ran, kept.<reason>, dropped,
        over_budget, spilled, buffered_bytes, peak_buffer_bytes, reports, ..."""
        counts: dict[str, int] = {}
        inner = getattr(self.next, "stats", None)
        if callable(inner):
            counts.update(inner())
        with self._lock:
            counts.update({f"tail_{k}": v for k, v in self._ledger.counts.items()})
            counts["tail_buffered_bytes"] = self._buffer.bytes
            counts["tail_undecided"] = len(self._buffer.undecided)
        return counts

    def _after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._reset_state()


def report_span(key: StepKey, counts: Mapping[str, int], context: SpanContext,
                resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The ``otel_verl.sampling_report`` span of one step's counts since its last report: ran,
    dropped, over budget, and kept per reason (every built-in reason, and a policy's own)."""
    experiment, validate, step_number = key
    attributes: dict[str, Any] = {
        semconv.ROLLOUT_VALIDATE: validate,
        semconv.ROLLOUT_SAMPLING_RAN: counts.get("ran", 0),
        semconv.ROLLOUT_SAMPLING_DROPPED: counts.get("dropped", 0),
        semconv.ROLLOUT_SAMPLING_OVER_BUDGET: counts.get("over_budget", 0),
    }
    if experiment is not None:
        attributes[semconv.ROLLOUT_EXPERIMENT_NAME] = experiment
    if step_number is not None:
        attributes[semconv.ROLLOUT_STEP] = step_number
    for reason in semconv.SAMPLING_REASONS:
        attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + reason] = counts.get("kept." + reason, 0)
    for what, number in counts.items():  # reasons of your own policies
        reason = what[len("kept."):]
        if what.startswith("kept.") and reason not in semconv.SAMPLING_REASONS:
            attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + reason] = number
        elif what.startswith("flagged."):  # the detectors' flags (docs/signals.md)
            attributes[semconv.ROLLOUT_SAMPLING_FLAGGED_PREFIX + what[len("flagged."):]] = number
    now = time.time_ns()
    return ReadableSpan(name=semconv.SAMPLING_REPORT_SPAN, context=context, resource=resource,
                        attributes=attributes, kind=SpanKind.INTERNAL, start_time=now,
                        end_time=now, instrumentation_scope=scope)


_POLICY_WARNING = _errors.RateLimitedWarning(_log)


def _reset_in_child(processor: TailSamplingProcessor) -> None:
    processor._after_fork_in_child()


_AFTER_FORK: LiveInstances[TailSamplingProcessor] = LiveInstances("tail sampling",
                                                                  _reset_in_child)
