"""The LLM hop: verl's ``LLMServerClient.generate`` span, and its context carried into vLLM.

- In the agent-loop worker, the ``LLMServerClient.generate`` op span gets GenAI request/usage
  attributes, and (vLLM only) its W3C headers go into a copy of the request's
  ``sampling_params["extra_args"]`` under ``VLLM_EXTRA_ARGS_KEY``.
- In the vLLM server actor, ``vllm.v1.engine.async_llm.AsyncLLM.generate`` takes them out again
  and passes them as ``trace_headers=`` (only when vLLM's own tracing is on), so vLLM's
  ``llm_request`` span is a child of the ``LLMServerClient.generate`` span.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import otel_verl
from otel_verl import _errors, semconv
from otel_verl.integrations.verl import _policy
from otel_verl.integrations.verl._common import LOCK, MARK, S, current_span, set_attr
from otel_verl.semconv import GenAIOperation

_log = logging.getLogger("otel_verl")

VLLM_ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"

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


def generate_before(owner: Any, kwargs: dict[str, Any]) -> None:
    """Inside ``LLMServerClient.generate``'s span, before the call: request attributes, carry."""
    span = current_span()
    if span is None:
        return
    _carry_context_to_vllm(owner, kwargs)
    attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: GenAIOperation.TEXT_COMPLETION,
                             **semconv.genai_request_attributes(kwargs.get("sampling_params"))}
    prompt_ids = kwargs.get("prompt_ids")
    if prompt_ids is not None and hasattr(prompt_ids, "__len__"):
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt_ids)
    span.set_attributes(attrs)


def generate_after(result: Any) -> None:
    """Inside ``LLMServerClient.generate``'s span, after the call: output usage, finish reason."""
    span = current_span()
    token_ids = getattr(result, "token_ids", None)
    if span is None or token_ids is None:
        return
    _policy.record_reply(span, result)  # rl.policy.version from verl's reply (global_steps)
    span.set_attribute(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, len(token_ids))
    stop = getattr(result, "stop_reason", None)
    if isinstance(stop, str):
        span.set_attribute(semconv.GEN_AI_RESPONSE_FINISH_REASONS, [stop])


# --- in the vLLM server actor --------------------------------------------------------------------


def patch_vllm_async_llm(module: ModuleType) -> None:
    """Post-import hook of ``vllm.v1.engine.async_llm`` (in verl's vLLM server actor process)."""
    with LOCK:
        engine = getattr(module, "AsyncLLM", None)
        generate = getattr(engine, "generate", None) if engine is not None else None
        if not S.installed or generate is None or getattr(generate, MARK, False):
            return
        try:
            params = inspect.signature(generate).parameters
        except (TypeError, ValueError):
            return
        if "trace_headers" not in params or "sampling_params" not in params:
            _log.warning("otel_verl: vLLM's AsyncLLM.generate takes no trace_headers; engine "
                         "spans will not join the rollout's traces")
            return
        set_attr(engine, "generate", _engine_generate(generate))


def _engine_generate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _take_carried_headers(self, args, kwargs)
        except Exception as exc:
            _errors.internal_error(exc, "vLLM trace headers")
        return original(self, *args, **kwargs)

    setattr(generate, MARK, True)
    return generate


def _take_carried_headers(engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    extra = getattr(params, "extra_args", None)
    if not isinstance(extra, dict) or VLLM_EXTRA_ARGS_KEY not in extra:
        return
    headers = extra.pop(VLLM_EXTRA_ARGS_KEY)  # keep the engine core's request clean
    if not extra and params is not None:
        params.extra_args = None
    observability = getattr(engine, "observability_config", None)
    tracing_on = getattr(observability, "otlp_traces_endpoint", None) is not None
    # with vLLM's tracing off it would drop the headers with a warning per request: don't pass
    if tracing_on and isinstance(headers, dict) and kwargs.get("trace_headers") is None:
        kwargs["trace_headers"] = {str(k): str(v) for k, v in headers.items()}
