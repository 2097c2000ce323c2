"""Attribute keys the exporter reads and environment variables it honours, in one place.

The ``rollout.*`` keys are the documented defaults of otel_verl (``otel_verl/semconv.py``); the
exporter does not import otel_verl, so the strings live here too. Any span attribute whose key
starts with :data:`ROLLOUT_PREFIX` becomes a Weave call attribute with the prefix stripped
(``rollout.step`` -> ``step``), which is how verl names them in Weave.
"""

from __future__ import annotations

from typing import Final

# --- trajectory identity (otel_verl defaults) ---------------------------------------------------
ROLLOUT_PREFIX: Final = "rollout."
ROLLOUT_STEP: Final = "rollout.step"
ROLLOUT_SAMPLE_INDEX: Final = "rollout.sample_index"
ROLLOUT_ROLLOUT_N: Final = "rollout.rollout_n"
ROLLOUT_VALIDATE: Final = "rollout.validate"
ROLLOUT_EXPERIMENT_NAME: Final = "rollout.experiment_name"
#: structural markers: the trajectory span, and spans whose parent is a trajectory span
OTEL_VERL_TRAJECTORY: Final = "otel_verl.trajectory"
OTEL_VERL_TRAJECTORY_CHILD: Final = "otel_verl.trajectory_child"
#: on a trajectory span nothing described itself: the name of its agent loop op (its first
#: top-level op), whose input and output (with the reward) the trajectory span then carries
OTEL_VERL_TRAJECTORY_OP: Final = "otel_verl.trajectory_op"

# --- per-turn content (otel_verl docs/content.md): an LLM call's input field holds only what it
# appended to its base; the whole prompt is content(base)[:base_len] + delta ----------------------
CONTENT_PREFIX: Final = "otel_verl.content."
CONTENT_ID: Final = "otel_verl.content.id"
CONTENT_LEN: Final = "otel_verl.content.len"
CONTENT_KIND: Final = "otel_verl.content.kind"
CONTENT_FIELD: Final = "otel_verl.content.field"
CONTENT_DELTA_LEN: Final = "otel_verl.content.delta_len"
CONTENT_INLINE: Final = "otel_verl.content.inline"
CONTENT_BASE_ID: Final = "otel_verl.content.base_id"
CONTENT_BASE_LEN: Final = "otel_verl.content.base_len"
CONTENT_BASE_SPAN_ID: Final = "otel_verl.content.base_span_id"
CONTENT_OUTPUT_ID: Final = "otel_verl.content.output_id"
CONTENT_OUTPUT_LEN: Final = "otel_verl.content.output_len"
#: how many references into the content store a span's payloads hold: ``{"$content": ID, "len":
#: n, "delta": [...]}`` (the first n items of ID, then delta) or ``{"$content": ID, "start": s,
#: "len": n}`` (items s to s + n of ID)
CONTENT_REFS: Final = "otel_verl.content.refs"
CONTENT_REF_KEY: Final = "$content"
#: the content store's folder (``<trace_dir>/content``), read for deltas beyond a span's cap
ENV_CONTENT_DIR: Final = "OTEL_EXPORTER_WEAVE_CONTENT_DIR"
#: a prompt (or a turn's own delta) whose JSON is at most this many bytes is shown inline
ENV_CONTENT_INLINE_BYTES: Final = "OTEL_EXPORTER_WEAVE_CONTENT_INLINE_BYTES"

# --- OpenInference / GenAI ----------------------------------------------------------------------
INPUT_VALUE: Final = "input.value"
INPUT_MIME_TYPE: Final = "input.mime_type"
OUTPUT_VALUE: Final = "output.value"
OUTPUT_MIME_TYPE: Final = "output.mime_type"
MIME_JSON: Final = "application/json"
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_KIND_LLM: Final = "LLM"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
#: ``gen_ai.operation.name`` values of a model call (one LLM turn); ``invoke_agent``,
#: ``execute_tool`` and the rest are not turns
GEN_AI_LLM_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content"})
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
#: Weave's own OTel conventions (what its ``/otel/v1/traces`` ingestion reads), honoured when
#: present on a span and written by :class:`WeaveOtlpSpanExporter`
WANDB_DISPLAY_NAME: Final = "wandb.display_name"
WANDB_THREAD_ID: Final = "wandb.thread_id"
WANDB_IS_TURN: Final = "wandb.is_turn"
WANDB_WB_RUN_ID: Final = "wandb.wb_run_id"
WANDB_WB_RUN_STEP: Final = "wandb.wb_run_step"
WANDB_ATTRIBUTES_PREFIX: Final = "wandb.attributes."
WANDB_RESOURCE_ENTITY: Final = "wandb.entity"
WANDB_RESOURCE_PROJECT: Final = "wandb.project"

#: consumed by the translation; never repeated under ``attributes.otel``
CONSUMED_KEYS: Final = frozenset(
    {
        INPUT_VALUE,
        INPUT_MIME_TYPE,
        OUTPUT_VALUE,
        OUTPUT_MIME_TYPE,
        OTEL_VERL_TRAJECTORY,
        OTEL_VERL_TRAJECTORY_CHILD,
        WANDB_DISPLAY_NAME,
    }
)

# --- environment --------------------------------------------------------------------------------
ENV_PROJECT: Final = "OTEL_EXPORTER_WEAVE_PROJECT"  # "project" or "entity/project"
ENV_ENDPOINT: Final = "OTEL_EXPORTER_WEAVE_ENDPOINT"  # trace server base URL
ENV_TIMEOUT: Final = "OTEL_EXPORTER_WEAVE_TIMEOUT"  # seconds, bound of one export()
ENV_SPOOL_DIR: Final = "OTEL_EXPORTER_WEAVE_SPOOL_DIR"  # undeliverable calls go here
ENV_KEEP_TRAJECTORY: Final = "OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY"  # "false": verl's tree shape
ENV_THREADS: Final = "OTEL_EXPORTER_WEAVE_THREADS"  # "false": no thread_id / turn_id
#: wandb's own variable: the run the calls belong to (wandb.init honours a preset one too)
WANDB_RUN_ID: Final = "WANDB_RUN_ID"
WANDB_API_KEY: Final = "WANDB_API_KEY"
WANDB_ENTITY: Final = "WANDB_ENTITY"
WANDB_PROJECT: Final = "WANDB_PROJECT"
WANDB_BASE_URL: Final = "WANDB_BASE_URL"
WANDB_PUBLIC_BASE_URL: Final = "WANDB_PUBLIC_BASE_URL"
#: weave's own override of the trace server URL
WF_TRACE_SERVER_URL: Final = "WF_TRACE_SERVER_URL"

#: weave's defaults (weave/trace/env.py): the multi-tenant trace server, used when the W&B base
#: URL is the public one; a dedicated / self-managed W&B serves traces under ``{base}/traces``
DEFAULT_WANDB_BASE_URL: Final = "https://api.wandb.ai"
DEFAULT_TRACE_SERVER_URL: Final = "https://trace.wandb.ai"

# --- server limits (weave/trace_server_bindings/http_utils.py; hosted store row cap) -------------
MAX_REQUEST_BYTES: Final = 31 * 1024 * 1024
MAX_CALL_BYTES: Final = 3_500_000
MAX_OP_NAME_CHARS: Final = 128
MAX_DISPLAY_NAME_CHARS: Final = 1024
