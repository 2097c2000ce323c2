"""Every span and resource attribute key otel_verl emits or reads, in one place.

Nothing else in otel_verl spells these strings. The GenAI names are pinned to the OpenTelemetry
GenAI semantic conventions v1.41 (still "Development"); the OpenInference names are the ones
Phoenix, Arize, Weave and Langfuse read.

Usage::

    from otel_verl import semconv
    span.set_attribute(semconv.ROLLOUT_STEP, 3)
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Final

# --- trajectory identity: on every span inside a trajectory -------------------------------------
ROLLOUT_STEP: Final = "rollout.step"
ROLLOUT_SAMPLE_INDEX: Final = "rollout.sample_index"
ROLLOUT_ROLLOUT_N: Final = "rollout.rollout_n"
ROLLOUT_VALIDATE: Final = "rollout.validate"
ROLLOUT_EXPERIMENT_NAME: Final = "rollout.experiment_name"
#: on the resource (and on the trajectory span), not repeated on every span
ROLLOUT_PROJECT_NAME: Final = "rollout.project_name"
#: the trajectory's reward, set on the trajectory span (and the run span) once known
ROLLOUT_REWARD: Final = "rollout.reward"
#: how many turns the trajectory took, set on the trajectory span by the agent loop
ROLLOUT_NUM_TURNS: Final = "rollout.num_turns"

#: the attributes copied onto every span of a trajectory, in the order verl lists them
TRAJECTORY_KEYS: Final = (
    ROLLOUT_STEP,
    ROLLOUT_SAMPLE_INDEX,
    ROLLOUT_ROLLOUT_N,
    ROLLOUT_VALIDATE,
    ROLLOUT_EXPERIMENT_NAME,
)

# --- otel_verl's own structural markers ---------------------------------------------------------
#: True on the span opened by ``rollout_trace_attr``
OTEL_VERL_TRAJECTORY: Final = "otel_verl.trajectory"
#: True on a span whose direct parent is a trajectory span (lets exporters drop the trajectory
#: span and promote its children, the way verl's weave backend shapes the tree)
OTEL_VERL_TRAJECTORY_CHILD: Final = "otel_verl.trajectory_child"
#: on a trajectory span that nothing described itself (no ``set_trajectory_input/output``): the
#: name of its agent loop op (its first top-level AGENT op, else its first top-level op, e.g.
#: ``ToolAgentLoop.run``), whose input and output (with the reward) the trajectory then shows;
#: the Weave exporter names its root call so
OTEL_VERL_TRAJECTORY_OP: Final = "otel_verl.trajectory_op"
#: names of the payload fields that were cut to fit the size caps (list of str)
OTEL_VERL_TRUNCATED: Final = "otel_verl.truncated"
#: True on a span the durable log cut to fit ``max_request_bytes`` (its longest strings, then its
#: events); not ``otel_verl.truncated``, which capture writes and which the cut keeps
OTEL_VERL_REQUEST_TRUNCATED: Final = "otel_verl.request_truncated"
#: how many values were replaced by the redaction marker in this span's payloads
OTEL_VERL_REDACTED: Final = "otel_verl.redacted"
#: payload serialisation problems (e.g. an object whose repr raised), as text
OTEL_VERL_PAYLOAD_ERROR: Final = "otel_verl.payload_error"

# --- per-turn content: what an LLM call adds, by reference (docs/content.md, otel_verl._content) -
#: the content id of the call's whole input field (its prompt): ``tok:sha256:<64 hex>``
CONTENT_ID: Final = "otel_verl.content.id"
#: length of the whole prompt (tokens, or messages)
CONTENT_LEN: Final = "otel_verl.content.len"
#: ``tokens`` or ``messages``
CONTENT_KIND: Final = "otel_verl.content.kind"
#: the input key delta-coded in ``input.value`` (``prompt_ids``, ``messages``): it holds only
#: what this call appended to its base (a head of it when ``otel_verl.content.inline`` is false)
CONTENT_FIELD: Final = "otel_verl.content.field"
#: how many items this call appended (the delta's length)
CONTENT_DELTA_LEN: Final = "otel_verl.content.delta_len"
#: True when ``input.value`` holds the whole delta; false: a head (the rest is in the store)
CONTENT_INLINE: Final = "otel_verl.content.inline"
#: ``stored`` (the node is in the content store) or ``missing`` (the store was over budget)
CONTENT_STORED: Final = "otel_verl.content.stored"
#: what the prompt extends: the previous call's prompt + response (id, length, span id)
CONTENT_BASE_ID: Final = "otel_verl.content.base_id"
CONTENT_BASE_LEN: Final = "otel_verl.content.base_len"
CONTENT_BASE_SPAN_ID: Final = "otel_verl.content.base_span_id"
#: the prompt + this call's response (the next call's base): id, length, store state
CONTENT_OUTPUT_ID: Final = "otel_verl.content.output_id"
CONTENT_OUTPUT_LEN: Final = "otel_verl.content.output_len"
CONTENT_OUTPUT_STORED: Final = "otel_verl.content.output_stored"
#: on the trajectory span: the content id of its first LLM call's prompt
CONTENT_PROMPT_ID: Final = "otel_verl.content.prompt_id"
#: ``gen_ai.input.messages`` holds the messages appended since the trajectory's previous call;
#: these say which whole message list that makes (id, length, store state) and what it extends
CONTENT_MESSAGES_ID: Final = "otel_verl.content.messages_id"
CONTENT_MESSAGES_LEN: Final = "otel_verl.content.messages_len"
CONTENT_MESSAGES_STORED: Final = "otel_verl.content.messages_stored"
CONTENT_MESSAGES_BASE_ID: Final = "otel_verl.content.messages_base_id"
CONTENT_MESSAGES_BASE_LEN: Final = "otel_verl.content.messages_base_len"
#: how many values of ``input.value``/``output.value`` are references into the content store
#: (``{"$content": id, "len": n, "delta": [...]}`` or ``{"$content": id, "start": s, "len": n}``)
CONTENT_REFS: Final = "otel_verl.content.refs"

# --- policy version: which weights sampled each turn (issue 22, docs/parity.md) ---------------
#: on an LLM call: the version of the weights that served it (verl: the ``global_steps`` of the
#: last weight sync, read from the server's reply; else ``otel_verl.set_policy_version``)
RL_POLICY_VERSION: Final = "rl.policy.version"
#: on the trajectory span: the oldest and newest version among its LLM calls
RL_POLICY_MIN_VERSION: Final = "rl.policy.min_version"
RL_POLICY_MAX_VERSION: Final = "rl.policy.max_version"
#: on the trajectory span: how many weight updates the oldest version lags the weights the step
#: that trains on it updates: ``rollout.step - 1 - rl.policy.min_version`` (0: on-policy; a
#: version counts the updates in the weights, step k trains the weights of k - 1 updates)
RL_POLICY_STALENESS: Final = "rl.policy.staleness"

# --- OpenInference -----------------------------------------------------------------------------
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
INPUT_VALUE: Final = "input.value"
INPUT_MIME_TYPE: Final = "input.mime_type"
OUTPUT_VALUE: Final = "output.value"
OUTPUT_MIME_TYPE: Final = "output.mime_type"
MIME_JSON: Final = "application/json"
MIME_TEXT: Final = "text/plain"
#: groups traces into a session (Phoenix's Sessions view): a GRPO group (experiment, step, sample)
SESSION_ID: Final = "session.id"
#: free-form JSON object Phoenix shows as a span's metadata and filters on (``metadata['step']``)
METADATA: Final = "metadata"
#: resource attribute: the Phoenix project the spans land in (= ``rollout.project_name``)
OPENINFERENCE_PROJECT_NAME: Final = "openinference.project.name"


class SpanKindName:
    """Values of ``openinference.span.kind``."""

    AGENT: Final = "AGENT"
    CHAIN: Final = "CHAIN"
    LLM: Final = "LLM"
    TOOL: Final = "TOOL"
    EVALUATOR: Final = "EVALUATOR"


# --- GenAI semantic conventions (v1.41 names) ---------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_EVALUATION_RESULT: Final = "gen_ai.evaluation.result"  # event name
GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL: Final = "gen_ai.evaluation.score.label"


class GenAIOperation:
    """Values of ``gen_ai.operation.name``."""

    CHAT: Final = "chat"
    TEXT_COMPLETION: Final = "text_completion"
    GENERATE_CONTENT: Final = "generate_content"
    EXECUTE_TOOL: Final = "execute_tool"
    INVOKE_AGENT: Final = "invoke_agent"
    EVALUATE: Final = "evaluate"  # otel_verl's name for reward spans (no GenAI value exists yet)


#: the ``gen_ai.operation.name`` values of a model call, for every reader (the write side's
#: detectors, the store's record, compaction): a tuple, since an attribute may be a list, which a
#: set would refuse to hash
LLM_OPERATIONS: Final = (GenAIOperation.CHAT, GenAIOperation.TEXT_COMPLETION,
                         GenAIOperation.GENERATE_CONTENT)


# --- resource -----------------------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"

# --- W3C trace context carrier keys -------------------------------------------------------------
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
#: our key in a cross-process carrier: the trajectory attributes as JSON
CARRIER_TRAJECTORY: Final = "otel-verl-trajectory"

# --- sampling: why a trajectory was exported, and with what weight ------------------------------
#: on every exported trajectory span: why it was kept (a ``SamplingReason`` value)
ROLLOUT_SAMPLING_REASON: Final = "rollout.sampling.reason"
#: on every exported trajectory span: the inverse of its inclusion probability (Horvitz-Thompson
#: weight): N_samples / N_traced for the head rule, 1 for tail rules and ``all``, 0 for
#: ``overflow`` (exported only because the tail buffer was full: not part of the sample)
ROLLOUT_SAMPLING_WEIGHT: Final = "rollout.sampling.weight"
#: how the trajectory ended, set on the trajectory span by an agent loop (verl's termination
#: names: ``no_tool_call``, ``response_length``, ``max_assistant_turns``, ``max_user_turns``)
ROLLOUT_TERMINATION: Final = "rollout.termination"
#: terminations that count as truncated for the ``truncated`` tail rule
TRUNCATING_TERMINATIONS: Final = ("response_length", "max_assistant_turns", "max_user_turns")
#: finish reasons (``gen_ai.response.finish_reasons``) that count as truncated
TRUNCATING_FINISH_REASONS: Final = ("length", "max_tokens")
#: OTel's general error attribute; a span carrying it counts as an error for the ``errors`` rule
#: (tools that return an error result without raising set it)
ERROR_TYPE: Final = "error.type"
#: True on the trajectory span of a trajectory recorded provisionally (``trace=False`` while
#: ``tail_keep`` is set): its spans wait for the tail decision
OTEL_VERL_PROVISIONAL: Final = "otel_verl.provisional"
#: the per-step per-worker sampling report: a small root span with the counts below
SAMPLING_REPORT_SPAN: Final = "otel_verl.sampling_report"
#: report counts: trajectories that ended (and were decided) since the previous report ...
ROLLOUT_SAMPLING_RAN: Final = "rollout.sampling.ran"
#: ... kept per reason: ``rollout.sampling.kept.<reason>`` ...
ROLLOUT_SAMPLING_KEPT_PREFIX: Final = "rollout.sampling.kept."
#: ... and dropped (ran = sum of kept.* + dropped)
ROLLOUT_SAMPLING_DROPPED: Final = "rollout.sampling.dropped"
#: of the dropped: matched a tail rule but ``tail_max_per_step_per_worker`` was spent
ROLLOUT_SAMPLING_OVER_BUDGET: Final = "rollout.sampling.over_budget"

# --- RL signals: detector flags and reward components (otel_verl.exporters._detect, docs/signals.md)
#: on a flagged trajectory span: the names of its flags (tuple of str), sorted
RL_FLAGS: Final = "rl.flags"
#: ``rl.flag.<name>`` = True on a flagged trajectory span, ``rl.flag.<name>.evidence`` = a short
#: JSON object saying why (e.g. ``{"turn": 2, "finish_reason": "length"}``)
RL_FLAG_PREFIX: Final = "rl.flag."
RL_FLAG_EVIDENCE_SUFFIX: Final = ".evidence"
#: report counts: flagged trajectories per flag since the previous report
#: (``rollout.sampling.flagged.<name>``)
ROLLOUT_SAMPLING_FLAGGED_PREFIX: Final = "rollout.sampling.flagged."
#: ``rollout.reward.<component>`` = the component's score on the trajectory span (and
#: ``rollout.reward.<component>.label``): the lake's ``reward_components``, Weave's
#: ``attributes.reward.<component>``, filterable in Jaeger and Phoenix
RL_REWARD_PREFIX: Final = ROLLOUT_REWARD + "."
RL_REWARD_LABEL_SUFFIX: Final = ".label"
#: the GenAI evaluation event's explanation (free text) and the span it evaluates
GEN_AI_EVALUATION_EXPLANATION: Final = "gen_ai.evaluation.explanation"
#: on a trajectory's evaluation event for a per-turn reward: the span id (16 hex) of the turn
OTEL_VERL_EVALUATED_SPAN_ID: Final = "otel_verl.evaluation.span_id"


def flag_key(name: str) -> str:
    """``rl.flag.<name>``."""
    return RL_FLAG_PREFIX + name


def flag_evidence_key(name: str) -> str:
    """``rl.flag.<name>.evidence``."""
    return RL_FLAG_PREFIX + name + RL_FLAG_EVIDENCE_SUFFIX


# --- live: in-flight records, stuck ops, stragglers (otel_verl._live, docs/live.md) -------------
#: a short span per op that became stuck, sent while it is stuck (child of it, op start to now)
IN_FLIGHT_SPAN: Final = "otel_verl.in_flight"
#: the per-step per-worker straggler report: a small root span with the attributes below
STRAGGLER_REPORT_SPAN: Final = "otel_verl.straggler_report"
#: on an in-flight span: the stuck op's name, span id (16 hex), seconds in flight, threshold,
#: what it waits on (the op in flight below it), its engine request id, the worker (host:pid)
OTEL_VERL_LIVE_OP: Final = "otel_verl.live.op"
OTEL_VERL_LIVE_SPAN_ID: Final = "otel_verl.live.span_id"
OTEL_VERL_LIVE_ELAPSED_S: Final = "otel_verl.live.elapsed_s"
OTEL_VERL_LIVE_THRESHOLD_S: Final = "otel_verl.live.threshold_s"
OTEL_VERL_LIVE_WAITING_ON: Final = "otel_verl.live.waiting_on"
OTEL_VERL_LIVE_REQUEST_ID: Final = "otel_verl.live.request_id"
OTEL_VERL_LIVE_WORKER: Final = "otel_verl.live.worker"
OTEL_VERL_LIVE_STUCK: Final = "otel_verl.live.stuck"
#: on an in-flight span, for receivers that start a call for the stuck op (the Weave exporter,
#: docs/weave.md "Running calls"): its parent span id (16 hex; absent for a root), its start
#: (ns since the epoch, exact), its input (``input.value`` up to LIVE_INPUT_MAX chars) and type
OTEL_VERL_LIVE_PARENT_SPAN_ID: Final = "otel_verl.live.parent_span_id"
OTEL_VERL_LIVE_START_NS: Final = "otel_verl.live.start_ns"
OTEL_VERL_LIVE_INPUT: Final = "otel_verl.live.input"
OTEL_VERL_LIVE_INPUT_MIME_TYPE: Final = "otel_verl.live.input_mime_type"
#: on an in-flight span: the stuck op is a direct child of its trajectory span
OTEL_VERL_LIVE_TRAJECTORY_CHILD: Final = "otel_verl.live.trajectory_child"
#: on an in-flight span: the stuck op's ``otel_verl.content.*`` attributes (JSON object), so a
#: receiver reads its delta-coded input as the op's own span would be read
OTEL_VERL_LIVE_CONTENT: Final = "otel_verl.live.content"
LIVE_INPUT_MAX: Final = 16384
#: on a straggler report: trajectories in the step, its wall time, the median trajectory, how
#: long the step waited on its tail, the slowest trajectories (JSON list) and the op that
#: dominated the slowest one
OTEL_VERL_STRAGGLER_TRAJECTORIES: Final = "otel_verl.straggler.trajectories"
OTEL_VERL_STRAGGLER_STEP_S: Final = "otel_verl.straggler.step_s"
OTEL_VERL_STRAGGLER_MEDIAN_S: Final = "otel_verl.straggler.median_s"
OTEL_VERL_STRAGGLER_TAIL_WAIT_S: Final = "otel_verl.straggler.tail_wait_s"
OTEL_VERL_STRAGGLER_SLOWEST: Final = "otel_verl.straggler.slowest"
OTEL_VERL_STRAGGLER_DOMINANT_OP: Final = "otel_verl.straggler.dominant_op"


class SamplingReason:
    """Values of ``rollout.sampling.reason``."""

    HEAD: Final = "head"
    ERROR: Final = "error"
    TRUNCATED: Final = "truncated"
    REWARD_OUTLIER: Final = "reward_outlier"
    GROUP: Final = "group"
    ALL: Final = "all"
    OVERFLOW: Final = "overflow"
    FLAG: Final = "flag"  # ``tail_keep=flags``: a detector flagged it (docs/signals.md)


#: every reason, in report order
SAMPLING_REASONS: Final = (SamplingReason.HEAD, SamplingReason.ALL, SamplingReason.ERROR,
                           SamplingReason.TRUNCATED, SamplingReason.REWARD_OUTLIER,
                           SamplingReason.GROUP, SamplingReason.OVERFLOW)


#: sampling-parameter keys -> GenAI request attributes, and the kind of number each takes
_GENAI_REQUEST_PARAMS: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (("temperature",), GEN_AI_REQUEST_TEMPERATURE, False),
    (("top_p",), GEN_AI_REQUEST_TOP_P, False),
    (("top_k",), GEN_AI_REQUEST_TOP_K, True),
    (("max_tokens", "max_new_tokens"), GEN_AI_REQUEST_MAX_TOKENS, True),
)


def genai_request_attributes(sampling_params: object) -> dict[str, int | float]:
    """The ``gen_ai.request.*`` attributes of an engine request's sampling parameters (vLLM's
    ``max_tokens`` or SGLang's ``max_new_tokens``), as plain ints and floats (numpy scalars
    included). Anything else (``None``, strings, bools, a float where an integer belongs) is left
    out rather than cast, so a span's start never fails on a caller's odd parameters."""
    if not isinstance(sampling_params, Mapping):
        return {}
    attrs: dict[str, int | float] = {}
    for keys, attr, integral in _GENAI_REQUEST_PARAMS:
        for key in keys:
            value: Any = sampling_params.get(key)
            kind = type(value)
            if kind is float and not integral or kind is int and integral:  # the usual case
                attrs[attr] = value
                break
            if kind is bool or not isinstance(value, numbers.Real):  # (ABC checks are slow)
                continue
            if integral:
                if isinstance(value, numbers.Integral):
                    attrs[attr] = int(value)
                    break
            else:
                attrs[attr] = float(value)
                break
    return attrs
