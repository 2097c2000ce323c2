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
``tail_buffer_bytes``. When it is full, the oldest undecided trajectory is exported early rather
than dropped (reason ``overflow``, weight 0: not part of the sample; counted). A trajectory that is
neither head- nor tail-kept costs its capture and is then discarded. ``tail_max_per_step_per_worker``
caps what the tail rules add per step (the rest counted as ``over_budget``).

Usage (``otel_verl._provider`` does this when ``tail_keep`` is set)::

    processor = TailSamplingProcessor(BoundedBatchProcessor(exporter), keep=("errors",),
                                      group_size=8, resource=provider.resource)
    provider.add_span_processor(processor)
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from otel_verl import _errors, semconv
from otel_verl._config import TraceConfig
from otel_verl._fork import LiveInstances
from otel_verl.exporters._spans import copy_span, shutdown_within
from otel_verl.semconv import SamplingReason

RULES = ("errors", "truncated", "reward_outliers", "groups")
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
#: reasons that make the ``groups`` rule keep the rest of the group
_RULE_REASONS = frozenset((SamplingReason.ERROR, SamplingReason.TRUNCATED,
                           SamplingReason.REWARD_OUTLIER))

StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)
GroupKey = tuple[Any, Any, Any, Any]  # (experiment, validate, step, sample_index)
_NO_ATTRIBUTES: Mapping[str, Any] = {}


def _attributes(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or _NO_ATTRIBUTES


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
    for event in span.events:
        size += _EVENT_OVERHEAD
        event_attributes: Mapping[str, Any] = event.attributes or _NO_ATTRIBUTES
        size += _ATTRIBUTE_OVERHEAD * len(event_attributes) + sum(
            len(v) for v in event_attributes.values() if type(v) is str)
    return size


def with_attributes(span: ReadableSpan, extra: Mapping[str, Any]) -> ReadableSpan:
    """A copy of a finished span with more attributes (a finished span cannot be changed)."""
    return copy_span(span, attributes={**(span.attributes or {}), **extra})


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


def reward_outliers(rewards: list[float], z: float) -> set[int]:
    """Positions of the outliers among a group's rewards (see the module docstring).

    Args:
        rewards: the group's rewards (two or more to find anything).
        z: the z-score threshold for continuous rewards.

    Returns:
        The positions in ``rewards`` of the trajectories to keep.
    """
    distinct = set(rewards)
    if len(rewards) < 2 or len(distinct) < 2:
        return set()
    if distinct <= {0.0, 1.0} or distinct <= {-1.0, 1.0}:  # binary: the minority outcome
        counts = collections.Counter(rewards)
        (low_value, low), (_, high) = sorted(counts.items(), key=lambda kv: kv[1])
        if low == high:  # a tie: both outcomes are as rare; keep the whole (informative) group
            return set(range(len(rewards)))
        return {i for i, r in enumerate(rewards) if r == low_value}
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    if std == 0.0 or not math.isfinite(std):
        return set()
    return {i for i, r in enumerate(rewards) if abs(r - mean) / std >= z}


class TailSamplingProcessor(SpanProcessor):
    """Holds spans of provisional trajectories until their tail decision; passes the rest on.

    Args:
        next_processor: the export processor (receives every span that is to be exported).
        keep: the tail rules, a subset of ``RULES``.
        group_size: trajectories per group (GRPO's n); None: groups end only at a step change,
            the timeout or a flush.
        reward_z: the z-score threshold for continuous rewards.
        max_per_step: most trajectories tail rules keep per step (None: no cap).
        buffer_bytes: the buffer for undecided trajectories, in estimated bytes.
        group_timeout_s: an incomplete group is decided after this long.
        resource: the provider's resource (for the report spans).
        clock: monotonic seconds (tests).
    """

    def __init__(self, next_processor: SpanProcessor, *, keep: Iterable[str],
                 group_size: int | None = None, reward_z: float = 2.0,
                 max_per_step: int | None = None, buffer_bytes: int = 64 * 1024 * 1024,
                 group_timeout_s: float = 300.0, resource: Resource | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        keep = tuple(keep)
        unknown = set(keep) - set(RULES)
        if unknown:
            raise ValueError(f"tail_keep: unknown rule(s) {sorted(unknown)}; known: "
                             f"{', '.join(RULES)}")
        self.next = next_processor
        self.keep = keep
        self._errors = "errors" in keep
        self._truncated = "truncated" in keep
        self._outliers = "reward_outliers" in keep
        self._groups = "groups" in keep
        self._grouped = self._outliers or self._groups
        self._group_size = group_size
        self._z = reward_z
        self._budget = max_per_step
        self._max_bytes = buffer_bytes
        self._timeout = group_timeout_s
        self._resource = resource or Resource.get_empty()
        self._scope = InstrumentationScope("otel_verl")
        self._clock = clock
        self._ids = RandomIdGenerator()
        self._lock = threading.RLock()
        self._reset_state()
        _AFTER_FORK.add(self)

    @classmethod
    def from_config(cls, next_processor: SpanProcessor, config: TraceConfig,
                    resource: Resource | None = None) -> TailSamplingProcessor:
        """The processor for a resolved configuration (``tail_keep``, ``group_size``, ...)."""
        return cls(next_processor, keep=config.tail_keep, group_size=config.group_size,
                   reward_z=config.tail_reward_z, max_per_step=config.tail_max_per_step_per_worker,
                   buffer_bytes=config.tail_buffer_bytes,
                   group_timeout_s=config.tail_group_timeout_s, resource=resource)

    def _reset_state(self) -> None:
        self._owner: dict[int, _Undecided] = {}  # span id -> its provisional trajectory
        self._undecided: dict[int, _Undecided] = {}  # trajectory span id -> it, oldest first
        self._waiting: dict[GroupKey, _Group] = {}  # groups not decided yet, oldest first
        self._closed: collections.OrderedDict[GroupKey, bool] = collections.OrderedDict()
        self._steps: dict[StepKey, _Step] = {}
        self._current: StepKey | None = None
        self._bytes = 0
        self._counts: collections.Counter[str] = collections.Counter()
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
        step_key: StepKey = (attributes.get(semconv.ROLLOUT_EXPERIMENT_NAME),
                             bool(attributes.get(semconv.ROLLOUT_VALIDATE)),
                             attributes.get(semconv.ROLLOUT_STEP))
        step = self._steps.get(step_key)
        if step is None:
            step = self._steps[step_key] = _Step()
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
                self._undecided[span_id] = trajectory
        out: list[ReadableSpan] = []
        if step_key != self._current:  # a step change: the steps with nothing running are over
            self._current = step_key
            for key, other in list(self._steps.items()):
                if key != step_key and other.open <= 0:
                    self._close_step(key, out)
        return out

    def _close_step(self, key: StepKey, out: list[ReadableSpan]) -> None:
        for group_key in [k for k in self._waiting if k[:3] == key]:
            self._decide_group(group_key, out)
        self._report(key, out)
        if len(self._steps) > _MAX_STEPS_KEPT:
            for old in list(self._steps)[: len(self._steps) - _MAX_STEPS_KEPT]:
                if self._steps[old].open <= 0 and not self._steps[old].counts:
                    del self._steps[old]

    def _step(self, key: StepKey) -> _Step:
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = _Step()
        return step

    def _count_head(self, span: ReadableSpan, out: list[ReadableSpan]) -> None:
        attributes = _attributes(span)
        key = (attributes.get(semconv.ROLLOUT_EXPERIMENT_NAME),
               bool(attributes.get(semconv.ROLLOUT_VALIDATE)), attributes.get(semconv.ROLLOUT_STEP))
        step = self._step(key)
        reason = attributes.get(semconv.ROLLOUT_SAMPLING_REASON) or SamplingReason.ALL
        self._count(step, "kept." + str(reason))
        self._trajectory_ended(key, step, out)

    def _trajectory_ended(self, key: StepKey, step: _Step, out: list[ReadableSpan]) -> None:
        step.open -= 1
        if step.open <= 0 and key != self._current:
            self._close_step(key, out)
        self._expire(out)

    def _child_ended(self, owner: _Undecided, span: ReadableSpan, out: list[ReadableSpan]) -> None:
        if owner.head_weight is not None:  # head-sampled: exported now, looked at for the rules
            self._inspect(owner, span)
            out.append(span)
            return
        if owner.verdict is not None or owner.spilled:  # decided, or exported early
            if owner.verdict is False:
                self._counts["late_spans_dropped"] += 1
            else:
                out.append(span)
            return
        self._inspect(owner, span)
        size = span_bytes(span)
        owner.spans.append(span)
        owner.bytes += size
        self._add_bytes(size, out)

    def _inspect(self, owner: _Undecided, span: ReadableSpan) -> None:
        attributes = _attributes(span)
        if span.status.status_code is StatusCode.ERROR or \
                attributes.get(semconv.ERROR_TYPE) is not None:
            owner.error = True
        reasons = attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
        if reasons and not isinstance(reasons, str) and any(r in _TRUNCATING_FINISH
                                                            for r in reasons):
            owner.truncated = True
        if attributes.get(semconv.ROLLOUT_TERMINATION) in _TRUNCATING_TERMINATIONS:
            owner.truncated = True

    def _add_bytes(self, size: int, out: list[ReadableSpan]) -> None:
        self._bytes += size
        self._counts["peak_buffer_bytes"] = max(self._counts["peak_buffer_bytes"], self._bytes)
        while self._bytes > self._max_bytes and self._undecided:
            self._spill(next(iter(self._undecided.values())), out)

    def _spill(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        """The buffer is full: export the oldest undecided trajectory now rather than drop it."""
        self._counts["spilled"] += 1
        del self._undecided[trajectory.span_id]
        out.extend(trajectory.spans)
        self._bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        trajectory.spilled = True
        if trajectory.root is not None:  # ended, waiting for its group: decided now
            if trajectory.head_weight is not None:
                self._export(trajectory, SamplingReason.HEAD, trajectory.head_weight, out)
            else:
                self._export(trajectory, SamplingReason.OVERFLOW, 0.0, out)

    def _root_ended(self, trajectory: _Undecided, span: ReadableSpan,
                    out: list[ReadableSpan]) -> None:
        self._inspect(trajectory, span)
        reward = _attributes(span).get(semconv.ROLLOUT_REWARD)
        if isinstance(reward, (int, float)) and not isinstance(reward, bool) and \
                math.isfinite(reward):
            trajectory.reward = float(reward)
        trajectory.root = span
        step = self._step(trajectory.step)
        own = (SamplingReason.ERROR if trajectory.error and self._errors else
               SamplingReason.TRUNCATED if trajectory.truncated and self._truncated else None)
        if own is not None and trajectory.verdict is None:
            self._keep(trajectory, own, out)
        elif not trajectory.spilled and self._grouped:  # it waits for its group: in the buffer
            size = span_bytes(span)
            trajectory.bytes += size
            self._undecided[trajectory.span_id] = trajectory
            self._add_bytes(size, out)
        if self._grouped:  # kept ones too: their group's rewards and the groups rule need them
            self._join_group(trajectory, out)
        elif trajectory.verdict is None:
            self._drop(trajectory, out)
        self._trajectory_ended(trajectory.step, step, out)

    def _join_group(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        key = trajectory.group
        closed = self._closed.get(key)
        if closed is not None:  # a straggler of a group decided already
            if trajectory.verdict is None:
                if closed and self._groups:
                    self._keep(trajectory, SamplingReason.GROUP, out)
                else:
                    self._drop(trajectory, out)
            return
        group = self._waiting.get(key)
        if group is None:
            group = self._waiting[key] = _Group(self._clock())
        group.members.append(trajectory)
        if self._group_size is not None and len(group.members) >= self._group_size:
            self._decide_group(key, out)

    def _decide_group(self, key: GroupKey, out: list[ReadableSpan]) -> None:
        group = self._waiting.pop(key)
        members = group.members
        if self._outliers:
            scored = [m for m in members if m.reward is not None]
            for position in sorted(reward_outliers([m.reward for m in scored], self._z)):  # type: ignore[misc]
                member = scored[position]
                if member.verdict is None:
                    self._keep(member, SamplingReason.REWARD_OUTLIER, out)
        kept = any(m.verdict and m.reason in _RULE_REASONS for m in members)
        for member in members:
            if member.verdict is None:
                if kept and self._groups:
                    self._keep(member, SamplingReason.GROUP, out)
                else:
                    self._drop(member, out)
        self._closed[key] = kept
        if len(self._closed) > _MAX_CLOSED_GROUPS:
            self._closed.popitem(last=False)

    def _keep(self, trajectory: _Undecided, reason: str, out: list[ReadableSpan]) -> None:
        if trajectory.head_weight is not None:  # a tail rule matches: it would be kept anyway,
            self._export(trajectory, reason, 1.0, out)  # so its inclusion probability is 1
            return
        step = self._step(trajectory.step)
        if self._budget is not None and step.tail_kept >= self._budget:
            self._count(step, "over_budget", ran=False)
            self._drop(trajectory, out)
            return
        step.tail_kept += 1
        self._export(trajectory, reason, 1.0, out)

    def _export(self, trajectory: _Undecided, reason: str, weight: float,
                out: list[ReadableSpan]) -> None:
        trajectory.verdict, trajectory.reason = True, reason
        self._undecided.pop(trajectory.span_id, None)
        out.extend(trajectory.spans)
        if trajectory.root is not None:
            out.append(with_attributes(trajectory.root, {
                semconv.ROLLOUT_SAMPLING_REASON: reason,
                semconv.ROLLOUT_SAMPLING_WEIGHT: weight}))
        self._bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        self._count(self._step(trajectory.step), "kept." + reason)

    def _drop(self, trajectory: _Undecided, out: list[ReadableSpan]) -> None:
        if trajectory.head_weight is not None:  # no tail rule matches: the head rule's weight
            self._export(trajectory, SamplingReason.HEAD, trajectory.head_weight, out)
            return
        if trajectory.spilled:  # its spans are out already: send its trajectory span too
            self._export(trajectory, SamplingReason.OVERFLOW, 0.0, out)
            return
        trajectory.verdict = False
        self._undecided.pop(trajectory.span_id, None)
        self._bytes -= trajectory.bytes
        trajectory.spans, trajectory.bytes = [], 0
        trajectory.root = None
        self._count(self._step(trajectory.step), "dropped")

    def _count(self, step: _Step, what: str, ran: bool = True) -> None:
        step.counts[what] += 1
        self._counts[what] += 1
        if ran:
            step.counts["ran"] += 1
            self._counts["ran"] += 1

    def _expire(self, out: list[ReadableSpan]) -> None:
        if not self._waiting:
            return
        deadline = self._clock() - self._timeout
        while self._waiting:
            key, group = next(iter(self._waiting.items()))
            if group.since > deadline:
                return
            self._counts["groups_timed_out"] += 1
            self._decide_group(key, out)

    def _report(self, key: StepKey, out: list[ReadableSpan]) -> None:
        step = self._steps.get(key)
        if step is None or not step.counts:
            return
        experiment, validate, step_number = key
        counts, step.counts = step.counts, collections.Counter()
        attributes: dict[str, Any] = {
            semconv.ROLLOUT_VALIDATE: validate,
            semconv.ROLLOUT_SAMPLING_RAN: counts["ran"],
            semconv.ROLLOUT_SAMPLING_DROPPED: counts["dropped"],
            semconv.ROLLOUT_SAMPLING_OVER_BUDGET: counts["over_budget"],
        }
        if experiment is not None:
            attributes[semconv.ROLLOUT_EXPERIMENT_NAME] = experiment
        if step_number is not None:
            attributes[semconv.ROLLOUT_STEP] = step_number
        for reason in semconv.SAMPLING_REASONS:
            attributes[semconv.ROLLOUT_SAMPLING_KEPT_PREFIX + reason] = counts["kept." + reason]
        now = time.time_ns()
        context = SpanContext(self._ids.generate_trace_id(), self._ids.generate_span_id(),
                              is_remote=False, trace_flags=_SAMPLED)
        out.append(ReadableSpan(name=semconv.SAMPLING_REPORT_SPAN, context=context,
                                resource=self._resource, attributes=attributes,
                                kind=SpanKind.INTERNAL, start_time=now, end_time=now,
                                instrumentation_scope=self._scope))
        self._counts["reports"] += 1

    # -- lifecycle -------------------------------------------------------------------------------
    def _decide_all(self, out: list[ReadableSpan], *, abandon_open: bool) -> None:
        """Decide every group that waits (a flush ends them), report every step."""
        for group_key in list(self._waiting):
            self._decide_group(group_key, out)
        if abandon_open:
            for trajectory in list(self._undecided.values()):
                self._counts["abandoned_open"] += 1
                self._undecided.pop(trajectory.span_id, None)
                self._bytes -= trajectory.bytes
                trajectory.spans, trajectory.bytes, trajectory.verdict = [], 0, False
        for key in list(self._steps):
            self._report(key, out)

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
            counts.update({f"tail_{k}": v for k, v in self._counts.items()})
            counts["tail_buffered_bytes"] = self._bytes
            counts["tail_undecided"] = len(self._undecided)
        return counts

    def _after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._reset_state()


def _reset_in_child(processor: TailSamplingProcessor) -> None:
    processor._after_fork_in_child()


_AFTER_FORK: LiveInstances[TailSamplingProcessor] = LiveInstances("tail sampling",
                                                                  _reset_in_child)
