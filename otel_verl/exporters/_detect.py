"""RL signals: detectors that flag known failure modes when a trajectory, its group or its step
ends, off the rollout's loop.

A detector is a function over a finished trajectory's record (``TrajectoryRecord``: its trajectory
span's attributes, its model turns, tool calls and evaluations) that returns evidence (a small
dict, or True) when the trajectory shows the failure, else None. A flagged trajectory span gets
``rl.flag.<name>`` = True, ``rl.flag.<name>.evidence`` (short JSON) and ``rl.flags`` (the names),
so every backend can filter on them, ``tail_keep=flags`` can keep them, and the sampling report
counts them. docs/signals.md lists the built-in detectors and their thresholds.

Built-in (``detect_flags`` names them; ``all`` = every one):

- when a trajectory ends: ``length_cap`` (a turn finished with ``length``, or its response tokens
  reached the request's ``max_tokens``), ``repeated_tool_calls`` (one tool called with identical
  arguments ``REPEAT_MIN`` times), ``tool_error_streak`` (``STREAK_MIN`` tool errors in a row),
  ``copied_prompt`` (the answer is a piece of the prompt, ``COPY_MIN_CHARS`` or longer),
  ``format_failure`` (a reward component ``format`` scored 0, or an evaluation labelled
  ``no_answer`` / ``format_error`` / ``parse_error``);
- when its step ends (every trajectory of the step on this worker, grouped by sample index):
  ``degenerate_group`` (a GRPO group of two or more, every reward equal: zero advantage),
  ``reward_outlier`` / ``length_outlier`` (robust z over the step, median and MAD, at least
  ``OUTLIER_Z``), ``reward_hacking`` (over the last ``TREND_STEPS`` steps of this worker, the
  mean reward rose while the mean ``correctness`` component fell, step to step; flags the
  step's trajectories rewarded at least the window's first step's mean reward while less
  correct than its mean correctness).

Your own::

    from otel_verl.exporters._detect import register_detector

    def empty_answer(trajectory):
        return {"answer": ""} if trajectory.answer == "" else None

    register_detector("empty_answer", empty_answer)
    RolloutTraceConfig.init(..., detect_flags=["length_cap", "empty_answer"])

Where it runs: ``FlaggingProcessor`` sits in front of the tail-sampling / export processor. On
the rollout's thread it only maps a span to its trajectory (a dict lookup) and queues the span;
a worker thread reads the finished spans (immutable), runs the detectors and passes the
trajectory span on, flagged, to the next processor. Other spans pass on at once. With a
step-level detector, trajectory spans wait on the worker until their step ends on this worker
(a trajectory of another step started and none of this step runs, ``step_timeout_s``, more than
``max_held`` waiting, or a flush).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_verl import _errors, semconv
from otel_verl._fork import LiveInstances
from otel_verl.exporters._spans import copy_span, shutdown_within

__all__ = [
    "DETECTORS",
    "STEP_DETECTORS",
    "Evaluation",
    "FlaggingProcessor",
    "ToolCall",
    "TrajectoryRecord",
    "Turn",
    "detect",
    "record_from_spans",
    "register_detector",
]

_log = logging.getLogger(__name__)
_WARNING = _errors.RateLimitedWarning(_log)

#: thresholds of the built-in detectors (docs/signals.md)
REPEAT_MIN = 3  # identical tool calls (same tool, same arguments) in one trajectory
STREAK_MIN = 3  # tool errors in a row
COPY_MIN_CHARS = 24  # the shortest answer that counts as copied from the prompt
OUTLIER_Z = 5.0  # robust z (|x - median| / (1.4826 MAD)) for reward and length outliers
OUTLIER_MIN_STEP = 8  # trajectories a step needs before outliers are looked for
TREND_STEPS = 3  # steps of history for reward_hacking
TREND_MIN_CHANGE = 0.05  # the least total rise of the reward and fall of correctness
FORMAT_COMPONENTS = ("format",)
FORMAT_FAILURE_LABELS = frozenset(("no_answer", "format_error", "parse_error", "invalid_format"))
CORRECTNESS_COMPONENTS = ("correctness", "correct", "accuracy")
_PAUSE_S = 0.05  # the worker's pause between batches (wakes <= 20 times a second)
_EVIDENCE_CHARS = 512  # an evidence JSON string is cut to this length
_LLM_OPERATIONS = semconv.LLM_OPERATIONS  # a tuple: an attribute may be an unhashable list
_LENGTH_FINISH = frozenset(semconv.TRUNCATING_FINISH_REASONS)


@dataclasses.dataclass(slots=True)
class Turn:
    """One model call of the trajectory."""

    span_id: int
    start_ns: int
    finish_reason: str | None = None
    output_tokens: int | None = None
    max_tokens: int | None = None


@dataclasses.dataclass(slots=True)
class ToolCall:
    """One tool call of the trajectory."""

    span_id: int
    start_ns: int
    name: str
    arguments: str | None = None
    error: bool = False


@dataclasses.dataclass(slots=True)
class Evaluation:
    """One ``gen_ai.evaluation.result`` (a reward or reward component) and the span it is on."""

    name: str
    score: float | None
    label: str | None = None
    explanation: str | None = None
    span_id: int | None = None


@dataclasses.dataclass(slots=True)
class TrajectoryRecord:
    """What a detector sees of one finished trajectory (turns and tools in start order)."""

    span_id: int
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    tools: list[ToolCall] = dataclasses.field(default_factory=list)
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    error: bool = False

    @property
    def step(self) -> Any:
        return self.attributes.get(semconv.ROLLOUT_STEP)

    @property
    def sample_index(self) -> Any:
        return self.attributes.get(semconv.ROLLOUT_SAMPLE_INDEX)

    @property
    def reward(self) -> float | None:
        """``rollout.reward`` when it is a finite number."""
        return _number(self.attributes.get(semconv.ROLLOUT_REWARD))

    @property
    def response_tokens(self) -> int:
        """The model's tokens over all turns."""
        return sum(t.output_tokens or 0 for t in self.turns)

    @property
    def prompt(self) -> str | None:
        """The trajectory's input as text (``set_trajectory_input``), when captured."""
        value = self.attributes.get(semconv.INPUT_VALUE)
        return value if isinstance(value, str) else None

    @property
    def answer(self) -> str | None:
        """The ``answer`` of the trajectory's output (``set_trajectory_output``), when captured."""
        value = self.attributes.get(semconv.OUTPUT_VALUE)
        if not isinstance(value, str) or not value.startswith("{"):
            return None
        try:
            answer = json.loads(value).get("answer")
        except (ValueError, AttributeError):
            return None
        return answer if isinstance(answer, str) else None

    def component(self, *names: str) -> Evaluation | None:
        """The last evaluation with one of ``names`` (a reward component), else None."""
        for evaluation in reversed(self.evaluations):
            if evaluation.name in names:
                return evaluation
        return None


#: a detector: the record -> evidence (a dict, or True) when flagged, else None / False
Detector = Callable[[TrajectoryRecord], "Mapping[str, Any] | bool | None"]
#: a step detector: the step's records, this worker's earlier step summaries -> evidence per
#: flagged record (by position)
StepDetector = Callable[[list[TrajectoryRecord], "list[_StepSummary]"],
                        "dict[int, Mapping[str, Any]]"]


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# --- the built-in trajectory detectors -----------------------------------------------------------


def detect_length_cap(trajectory: TrajectoryRecord) -> Mapping[str, Any] | None:
    for i, turn in enumerate(trajectory.turns):
        if turn.finish_reason in _LENGTH_FINISH:
            return {"turn": i, "finish_reason": turn.finish_reason,
                    "output_tokens": turn.output_tokens}
        if turn.max_tokens and turn.output_tokens is not None and \
                turn.output_tokens >= turn.max_tokens:
            return {"turn": i, "output_tokens": turn.output_tokens,
                    "max_tokens": turn.max_tokens}
    return None


def detect_repeated_tool_calls(trajectory: TrajectoryRecord) -> Mapping[str, Any] | None:
    counts = collections.Counter((t.name, t.arguments) for t in trajectory.tools
                                 if t.arguments is not None)
    if not counts:
        return None
    (name, arguments), count = counts.most_common(1)[0]
    if count < REPEAT_MIN:
        return None
    return {"tool": name, "arguments": (arguments or "")[:120], "count": count}


def detect_tool_error_streak(trajectory: TrajectoryRecord) -> Mapping[str, Any] | None:
    best = run = 0
    first = start = 0
    for i, tool in enumerate(trajectory.tools):
        if tool.error:
            if run == 0:
                start = i
            run += 1
            if run > best:
                best, first = run, start
        else:
            run = 0
    if best < STREAK_MIN:
        return None
    return {"errors_in_a_row": best, "first_call": first,
            "tools": sorted({t.name for t in trajectory.tools[first:first + best]})}


def _squash(text: str) -> str:
    return " ".join(text.split()).lower()


def detect_copied_prompt(trajectory: TrajectoryRecord) -> Mapping[str, Any] | None:
    answer, prompt = trajectory.answer, trajectory.prompt
    if not answer or not prompt:
        return None
    answer = _squash(answer)
    if len(answer) < COPY_MIN_CHARS:
        return None
    at = _squash(prompt).find(answer)
    if at < 0:
        return None
    return {"chars": len(answer), "prompt_offset": at, "answer_head": answer[:60]}


def detect_format_failure(trajectory: TrajectoryRecord) -> Mapping[str, Any] | None:
    component = trajectory.component(*FORMAT_COMPONENTS)
    if component is not None and component.score is not None and component.score <= 0.0:
        return {"component": component.name, "score": component.score,
                "label": component.label, "explanation": (component.explanation or "")[:120]}
    for evaluation in trajectory.evaluations:
        if evaluation.label in FORMAT_FAILURE_LABELS:
            return {"evaluation": evaluation.name, "label": evaluation.label}
    return None


# --- the built-in step detectors -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _StepSummary:
    step: Any
    reward: float | None
    correctness: float | None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def detect_degenerate_groups(records: list[TrajectoryRecord],
                             history: list[_StepSummary]) -> dict[int, Mapping[str, Any]]:
    groups: dict[Any, list[int]] = collections.defaultdict(list)
    for i, record in enumerate(records):
        groups[record.sample_index].append(i)
    flagged: dict[int, Mapping[str, Any]] = {}
    for sample_index, members in groups.items():
        rewards = [records[i].reward for i in members]
        if len(members) < 2 or any(r is None for r in rewards) or len(set(rewards)) != 1:
            continue
        evidence = {"sample_index": sample_index, "size": len(members), "reward": rewards[0],
                    "advantage": 0.0}
        for i in members:
            flagged[i] = evidence
    return flagged


def _robust_outliers(values: list[float | None], what: str) -> dict[int, Mapping[str, Any]]:
    present = [v for v in values if v is not None]
    if len(present) < OUTLIER_MIN_STEP:
        return {}
    median = statistics.median(present)
    mad = statistics.median(abs(v - median) for v in present)
    if mad == 0.0:  # over half the step is one value (binary rewards): nothing stands out
        return {}
    scale = 1.4826 * mad
    flagged: dict[int, Mapping[str, Any]] = {}
    for i, value in enumerate(values):
        if value is not None:
            z = (value - median) / scale
            if abs(z) >= OUTLIER_Z:
                flagged[i] = {what: value, "step_median": round(median, 6),
                              "robust_z": round(z, 2), "step_size": len(present)}
    return flagged


def detect_reward_outliers(records: list[TrajectoryRecord],
                           history: list[_StepSummary]) -> dict[int, Mapping[str, Any]]:
    return _robust_outliers([r.reward for r in records], "reward")


def detect_length_outliers(records: list[TrajectoryRecord],
                           history: list[_StepSummary]) -> dict[int, Mapping[str, Any]]:
    return _robust_outliers([float(r.response_tokens) if r.turns else None for r in records],
                            "response_tokens")


def _correctness(record: TrajectoryRecord) -> float | None:
    component = record.component(*CORRECTNESS_COMPONENTS)
    return component.score if component is not None else None


def detect_reward_hacking(records: list[TrajectoryRecord],
                          history: list[_StepSummary]) -> dict[int, Mapping[str, Any]]:
    """The mean reward rose and the mean correctness fell over the last ``TREND_STEPS`` steps
    (this one included), each step to the next."""
    window = history[-TREND_STEPS:]
    r = [s.reward for s in window if s.reward is not None]
    c = [s.correctness for s in window if s.correctness is not None]
    if len(r) < TREND_STEPS or len(c) < TREND_STEPS:
        return {}
    rising = all(b > a for a, b in zip(r, r[1:], strict=False)) and \
        r[-1] - r[0] >= TREND_MIN_CHANGE
    falling = all(b < a for a, b in zip(c, c[1:], strict=False)) and \
        c[0] - c[-1] >= TREND_MIN_CHANGE
    if not (rising and falling):
        return {}
    evidence: Mapping[str, Any] = {
        "steps": [s.step for s in window], "mean_reward": [round(x, 4) for x in r],
        "mean_correctness": [round(x, 4) for x in c]}
    # the trajectories rewarded at least as much as the window's first step on average while
    # less correct than it on average: what the trend is made of
    baseline_reward, baseline_correct = r[0], c[0]
    flagged: dict[int, Mapping[str, Any]] = {}
    for i, record in enumerate(records):
        reward, correct = record.reward, _correctness(record)
        if reward is not None and correct is not None and reward >= baseline_reward and \
                correct < baseline_correct:
            flagged[i] = evidence
    return flagged


# --- the registry ---------------------------------------------------------------------------------

#: trajectory detectors by name (built-in, then yours through ``register_detector``)
DETECTORS: dict[str, Detector] = {
    "length_cap": detect_length_cap,
    "repeated_tool_calls": detect_repeated_tool_calls,
    "tool_error_streak": detect_tool_error_streak,
    "copied_prompt": detect_copied_prompt,
    "format_failure": detect_format_failure,
}
#: detectors that need the whole step (and this worker's history)
STEP_DETECTORS: dict[str, StepDetector] = {
    "degenerate_group": detect_degenerate_groups,
    "reward_outlier": detect_reward_outliers,
    "length_outlier": detect_length_outliers,
    "reward_hacking": detect_reward_hacking,
}
BUILTIN = (*DETECTORS, *STEP_DETECTORS)
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


def register_detector(name: str, detector: Detector) -> None:
    """Add your own trajectory detector under ``name`` (then list it in ``detect_flags``).

    Raises:
        ValueError: a name that is not lowercase letters, digits and ``_``, or a built-in's.
    """
    if not name or not set(name) <= _NAME_OK:
        raise ValueError(f"detector name must be lowercase letters, digits and _: {name!r}")
    if name in STEP_DETECTORS or (name in DETECTORS and name in BUILTIN):
        raise ValueError(f"detector {name!r} is built in")
    if not callable(detector):
        raise TypeError(f"a detector is a function over a TrajectoryRecord, got {detector!r}")
    DETECTORS[name] = detector


def known_detectors() -> tuple[str, ...]:
    """Every name ``detect_flags`` accepts (``all`` aside)."""
    return (*DETECTORS, *STEP_DETECTORS)


def evidence_json(evidence: Mapping[str, Any] | bool) -> str:
    """The evidence as a short JSON string (cut to ``_EVIDENCE_CHARS``)."""
    if not isinstance(evidence, Mapping):
        return "{}"
    try:
        text = json.dumps(evidence, separators=(",", ":"), default=str, allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps({"evidence": str(evidence)[:_EVIDENCE_CHARS]})
    return text[:_EVIDENCE_CHARS]


def flag_attributes(flags: Mapping[str, Mapping[str, Any] | bool]) -> dict[str, Any]:
    """The attributes a flagged trajectory span gets."""
    attributes: dict[str, Any] = {semconv.RL_FLAGS: tuple(sorted(flags))}
    for name, evidence in flags.items():
        attributes[semconv.flag_key(name)] = True
        attributes[semconv.flag_evidence_key(name)] = evidence_json(evidence)
    return attributes


# --- reading spans into records (the worker's side) ----------------------------------------------


def observe(record: TrajectoryRecord, span: ReadableSpan) -> None:
    """What the detectors look at in one finished span of the trajectory."""
    attributes = span.attributes or {}
    _observe(record, attributes, ((e.name, e.attributes or {}) for e in span.events),
             span.status.status_code is StatusCode.ERROR, span.start_time or 0,
             span.context.span_id, span.name)


def _observe(record: TrajectoryRecord, attributes: Mapping[str, Any],
             events: Iterable[tuple[str, Mapping[str, Any]]], failed: bool, start: int,
             span_id: int, name: str) -> None:
    operation = attributes.get(semconv.GEN_AI_OPERATION_NAME)
    error = failed or semconv.ERROR_TYPE in attributes
    if operation in _LLM_OPERATIONS:
        reasons: Any = attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
        reason = reasons[0] if isinstance(reasons, (tuple, list)) and reasons else reasons
        tokens = attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS)
        cap = attributes.get(semconv.GEN_AI_REQUEST_MAX_TOKENS)
        record.turns.append(Turn(span_id, start, reason if isinstance(reason, str) else None,
                                 tokens if isinstance(tokens, int) else None,
                                 cap if isinstance(cap, int) else None))
    elif operation == semconv.GenAIOperation.EXECUTE_TOOL:
        arguments = attributes.get(semconv.GEN_AI_TOOL_CALL_ARGUMENTS)
        record.tools.append(ToolCall(span_id, start,
                                     str(attributes.get(semconv.GEN_AI_TOOL_NAME, name)),
                                     arguments if isinstance(arguments, str) else None, error))
    if error:
        record.error = True
    for event_name, ev in events:
        if event_name == semconv.GEN_AI_EVALUATION_RESULT:
            label = ev.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL)
            explanation = ev.get(semconv.GEN_AI_EVALUATION_EXPLANATION)
            record.evaluations.append(Evaluation(
                str(ev.get(semconv.GEN_AI_EVALUATION_NAME, "reward")),
                _number(ev.get(semconv.GEN_AI_EVALUATION_SCORE_VALUE)),
                label if isinstance(label, str) else None,
                explanation if isinstance(explanation, str) else None, span_id))


def record_from_spans(spans: Iterable[Mapping[str, Any]]) -> TrajectoryRecord:
    """The record of a stored trajectory (decoded spans, ``otel_verl.store.read_spans``'s
    ``SpanRecord`` dicts; the trajectory span among them), so the same detectors run over traces
    already on disk: ``detect(record_from_spans(t.spans), known_detectors())``."""
    record = TrajectoryRecord(0)
    for span in spans:
        attributes = span.get("attributes") or {}
        span_id = int(span.get("span_id") or "0", 16)
        if attributes.get(semconv.OTEL_VERL_TRAJECTORY) is True:
            record.attributes, record.span_id = attributes, span_id
        status = span.get("status") or {}
        _observe(record, attributes,
                 ((e.get("name", ""), e.get("attributes") or {}) for e in span.get("events") or ()),
                 status.get("code") == "ERROR", span.get("start_ns") or 0, span_id,
                 str(span.get("name", "")))
    return record


def detect(record: TrajectoryRecord, names: Iterable[str],
           errors: collections.Counter[str] | None = None) -> dict[str, Mapping[str, Any] | bool]:
    """The trajectory detectors ``names`` over ``record``: flag name -> evidence. One that
    raises has no opinion (counted in ``errors``, warned about)."""
    record.turns.sort(key=lambda t: t.start_ns)
    record.tools.sort(key=lambda t: t.start_ns)
    flags: dict[str, Mapping[str, Any] | bool] = {}
    for name in names:
        detector = DETECTORS.get(name)
        if detector is None:
            continue
        try:
            evidence = detector(record)
        except Exception as exc:
            if errors is not None:
                errors["detector_errors"] += 1
            _WARNING.warn("otel_verl: detector %s raised %s: %s (no flag)", name,
                          type(exc).__name__, exc)
            continue
        if evidence:
            flags[name] = evidence
    return flags


# --- the processor ---------------------------------------------------------------------------------

_StepKey = tuple[Any, Any, Any]  # (experiment, validate, step)


def _step_key(attributes: Mapping[str, Any]) -> _StepKey:
    return (attributes.get(semconv.ROLLOUT_EXPERIMENT_NAME),
            bool(attributes.get(semconv.ROLLOUT_VALIDATE)), attributes.get(semconv.ROLLOUT_STEP))


class _Step:
    __slots__ = ("held", "open", "since")

    def __init__(self, since: float) -> None:
        self.open = 0
        self.since = since
        #: ended trajectories waiting for the step: (record, trajectory span, flags so far)
        self.held: list[tuple[TrajectoryRecord, ReadableSpan, dict[str, Any]]] = []


class FlaggingProcessor(SpanProcessor):
    """Runs the detectors on a worker thread and passes each trajectory span on flagged.

    Args:
        next_processor: the tail-sampling or export processor.
        detectors: names among ``known_detectors()``.
        step_timeout_s: a step with trajectories waiting is decided after this long.
        max_held: trajectory spans waiting for their step, at most; beyond it the oldest step
            is decided early.
    """

    def __init__(self, next_processor: SpanProcessor, detectors: Iterable[str], *,
                 step_timeout_s: float = 300.0, max_held: int = 8192,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.next = next_processor
        names = tuple(detectors)
        unknown = set(names) - set(known_detectors())
        if unknown:
            raise ValueError(f"detect_flags: unknown detector(s) {sorted(unknown)}; known: "
                             f"{', '.join(known_detectors())}")
        self.trajectory_detectors = tuple(n for n in names if n in DETECTORS)
        self.step_detectors = tuple(n for n in names if n in STEP_DETECTORS)
        self._timeout = step_timeout_s
        self._max_held = max_held
        self._clock = clock
        self._start()
        _AFTER_FORK.add(self)

    @classmethod
    def from_config(cls, next_processor: SpanProcessor, config: Any) -> FlaggingProcessor:
        return cls(next_processor, config.detect_flags, step_timeout_s=config.tail_group_timeout_s)

    def _start(self) -> None:
        self._owner: dict[int, int] = {}  # span id -> its trajectory span id (rollout side)
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # the worker's own state
        self._records: collections.OrderedDict[int, TrajectoryRecord] = collections.OrderedDict()
        self._steps: dict[_StepKey, _Step] = {}
        self._current: _StepKey | None = None
        self._history: dict[tuple[Any, Any], collections.deque[_StepSummary]] = {}
        self._held = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self._stopped = False
        self._thread = threading.Thread(target=self._work, name="otel_verl-detect", daemon=True)
        self._thread.start()

    # -- the rollout's side: a lookup and a queue put ---------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attributes = span.attributes or {}
            if attributes.get(semconv.OTEL_VERL_TRAJECTORY):
                span_id = span.context.span_id
                self._owner[span_id] = span_id
                if self.step_detectors:
                    self._queue.put(("start", _step_key(attributes)))
            elif self._owner:
                parent = span.parent
                if parent is not None:
                    owner = self._owner.get(parent.span_id)
                    if owner is not None:
                        self._owner[span.context.span_id] = owner
        except Exception as exc:
            _errors.internal_error(exc, "detect on_start")
        self.next.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        owner = self._owner.pop(span.context.span_id, None) if self._owner else None
        if owner is None or self._stopped:
            self.next.on_end(span)
            return
        if owner == span.context.span_id:
            self._queue.put(("root", span))  # passed on by the worker, flagged
            return
        self._queue.put(("span", owner, span))
        self.next.on_end(span)

    # -- the worker -------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                item = ("tick",)
            started = time.thread_time_ns()
            while True:  # what is queued, in one go; then a pause (few GIL hand-overs)
                if item[0] == "stop":
                    item[1].set()
                    return
                try:
                    self._handle(item)
                except Exception as exc:
                    _errors.internal_error(exc, "detect worker")
                if item[0] in ("flush", "sync"):
                    item[1].set()
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self.counts["cpu_ns"] += time.thread_time_ns() - started
            time.sleep(_PAUSE_S)

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "span":
            _, owner, span = item
            record = self._records.get(owner)
            if record is None:
                record = self._records[owner] = TrajectoryRecord(owner)
                if len(self._records) > 65536:  # trajectories that never end: forget the oldest
                    self._records.popitem(last=False)
                    self.counts["records_forgotten"] += 1
            observe(record, span)
        elif kind == "root":
            self._root_ended(item[1])
        elif kind == "start":
            self._step_started(item[1])
        elif kind == "flush":
            for key in list(self._steps):
                self._decide_step(key)
        if self._steps:
            self._expire()

    def _root_ended(self, span: ReadableSpan) -> None:
        span_id = span.context.span_id
        record = self._records.pop(span_id, None) or TrajectoryRecord(span_id)
        observe(record, span)
        record.attributes = span.attributes or {}
        flags = detect(record, self.trajectory_detectors, self.counts)
        self.counts["trajectories"] += 1
        if not self.step_detectors:
            self._pass_on(span, flags)
            return
        key = _step_key(record.attributes)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = _Step(self._clock())
        step.open -= 1
        step.since = self._clock()  # a step is timed out from its last trajectory's end
        step.held.append((record, span, flags))
        self._held += 1
        if step.open <= 0 and key != self._current:
            self._decide_step(key)
        while self._held > self._max_held and self._steps:
            self.counts["steps_decided_early"] += 1
            self._decide_step(next(iter(self._steps)))

    def _step_started(self, key: _StepKey) -> None:
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = _Step(self._clock())
        step.open += 1
        if key != self._current:
            self._current = key
            for other, waiting in list(self._steps.items()):
                if other != key and waiting.open <= 0:
                    self._decide_step(other)

    def _expire(self) -> None:
        deadline = self._clock() - self._timeout
        for key, step in list(self._steps.items()):
            if step.since <= deadline and step.held:
                self.counts["steps_timed_out"] += 1
                self._decide_step(key)

    def _decide_step(self, key: _StepKey) -> None:
        step = self._steps.pop(key, None)
        if step is None:
            return
        if step.open > 0:  # still running here (a flush or timeout): keep counting it
            self._steps[key] = _Step(self._clock())
            self._steps[key].open = step.open
        held = step.held
        self._held -= len(held)
        if not held:
            return
        records = [record for record, _, _ in held]
        history = self._history.setdefault(key[:2], collections.deque(maxlen=TREND_STEPS + 1))
        history.append(_StepSummary(
            key[2], _mean([r.reward for r in records if r.reward is not None]),
            _mean([c for c in map(_correctness, records) if c is not None])))
        for name in self.step_detectors:
            try:
                found = STEP_DETECTORS[name](records, list(history))
            except Exception as exc:
                self.counts["detector_errors"] += 1
                _WARNING.warn("otel_verl: detector %s raised %s: %s (no flag)", name,
                              type(exc).__name__, exc)
                continue
            for i, evidence in found.items():
                held[i][2][name] = evidence
        for _, span, flags in held:
            self._pass_on(span, flags)

    def _pass_on(self, span: ReadableSpan, flags: dict[str, Any]) -> None:
        if flags:
            self.counts["flagged"] += 1
            for name in flags:
                self.counts["flag." + name] += 1
            span = copy_span(span, attributes={**(span.attributes or {}),
                                               **flag_attributes(flags)})
        self.next.on_end(span)

    # -- lifecycle --------------------------------------------------------------------------------
    def _drain(self, timeout_s: float, kind: str = "flush") -> bool:
        """Wait until the worker handled what is queued (``flush``: and decided every step)."""
        if not self._thread.is_alive():
            return False
        done = threading.Event()
        self._queue.put((kind, done))
        return done.wait(timeout_s)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000.0
        drained = self._drain(timeout_millis / 1000.0)
        left = max(0, int((deadline - time.monotonic()) * 1000))
        return self.next.force_flush(left) and drained

    def nudge(self) -> None:
        nudge = getattr(self.next, "nudge", None)
        if nudge is not None:
            nudge()

    def shutdown(self, timeout_millis: int = 10000) -> None:
        if self._stopped:
            return
        deadline = time.monotonic() + timeout_millis / 1000.0
        self._drain(timeout_millis / 2000.0)
        self._stopped = True
        stopped = threading.Event()
        self._queue.put(("stop", stopped))
        stopped.wait(max(0.0, deadline - time.monotonic()) / 2)
        left = max(0, int((deadline - time.monotonic()) * 1000))
        shutdown_within(self.next, left)

    def stats(self) -> dict[str, int]:
        """The next processor's counts plus ``detect_*``: trajectories, flagged, flag.<name>,
        detector_errors, cpu_ns (the worker's CPU time), ..."""
        counts: dict[str, int] = {}
        inner = getattr(self.next, "stats", None)
        if callable(inner):
            counts.update(inner())
        counts.update({f"detect_{k}": v for k, v in list(self.counts.items())})
        return counts

    def _after_fork_in_child(self) -> None:
        self._start()


def _reset_in_child(processor: FlaggingProcessor) -> None:
    processor._after_fork_in_child()


_AFTER_FORK: LiveInstances[FlaggingProcessor] = LiveInstances("detectors", _reset_in_child)
