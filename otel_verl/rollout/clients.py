"""Async HTTP clients for vLLM and SGLang that carry the trajectory's trace into the engine.

Usage::

    async with VLLMCompletionsClient("http://127.0.0.1:8000", model="tiny") as client:
        out = await client.generate("traj-0", prompt_ids=ids, sampling_params={"max_tokens": 64})
        out.token_ids, out.log_probs, out.finish_reason

Clients (all ``httpx.AsyncClient`` underneath, one connection pool per client object):

=========================  ==========================================  ============================
class                      endpoint                                    trace context sent as
=========================  ==========================================  ============================
``VLLMCompletionsClient``  vLLM ``/v1/completions``, token-id prompt,  ``traceparent`` header
                           ``return_token_ids`` (token in, token out)
``VLLMGenerateClient``     vLLM ``/inference/v1/generate`` (server     ``traceparent`` header
                           started with ``--enable-scale-out``)
``SGLangClient``           SGLang native ``/generate`` (``input_ids``)  header and body field
                                                                       ``external_trace_header``
``OpenAIChatClient``       ``/v1/chat/completions`` (vLLM or SGLang)   ``traceparent`` header
=========================  ==========================================  ============================

Tracing per call: one span per LLM call. The ``generate``/``chat`` method is a
``rollout_trace_op`` (verl traces its LLM client's ``generate`` the same way) of kind LLM and span
kind CLIENT, and that one span also carries the GenAI client attributes (``gen_ai.operation.name =
chat``, ``gen_ai.request.*`` sampling parameters, ``gen_ai.usage.*``,
``gen_ai.response.finish_reasons``, ``gen_ai.conversation.id``): the op's ``input.value`` /
``output.value`` and the GenAI view of the same call, side by side. The request is sent while that
span is current, so the engine's own request span (vLLM ``llm_request``) becomes its child, in the
trajectory's trace (before issue 18 a separate ``chat {model}`` child span carried the GenAI
attributes: two spans per call). With payload capture on (``capture_payloads``, the default), the
span also carries ``gen_ai.input.messages`` / ``gen_ai.output.messages`` in the GenAI JSON
message format (``{"role", "parts": [{"type": "text"|"tool_call"|"tool_call_response", ...}]}``),
through the same caps and redaction as ``input.value``. A token-in client sees only token ids: the
caller names the conversation it continues with
``with chat_messages(messages): await client.generate(...)`` (``ToolAgentLoop`` does), and the
output text is the engine's text or the tokenizer's decoding.

``sampling_params`` keys understood (verl's names; unknown keys are ignored): ``max_tokens`` (or
``max_new_tokens``), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``,
``repetition_penalty``, ``logprobs`` (bool: return the sampled tokens' logprobs), and
``structured_outputs`` (vLLM's field: ``{"regex": ...}``/``{"json": ...}``/``{"grammar": ...}``;
translated to SGLang's ``regex``/``json_schema``/``ebnf``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Span, SpanKind

import otel_verl
from otel_verl import semconv
from otel_verl._capture import input_messages_attrs, settle_messages
from otel_verl._hotpath import clean_attributes, merge_clean
from otel_verl.semconv import GenAIOperation, SpanKindName

__all__ = [
    "AsyncLLMClient",
    "AsyncTokenClient",
    "ChatOutput",
    "EngineError",
    "OpenAIChatClient",
    "SGLangClient",
    "TokenOutput",
    "VLLMCompletionsClient",
    "VLLMGenerateClient",
    "chat_messages",
    "genai_input_messages",
    "genai_output_messages",
]

#: the chat history the next token-in ``generate`` continues (set by ``chat_messages``)
_TURN_MESSAGES: contextvars.ContextVar[Sequence[Mapping[str, Any]] | None] = (
    contextvars.ContextVar("otel_verl_turn_messages", default=None))


@contextlib.contextmanager
def chat_messages(messages: Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """Name the chat history (OpenAI-style messages) that the ``generate`` calls inside continue.

    Token-in clients see only ids; with this, their ``chat`` span still records
    ``gen_ai.input.messages``. Costs one ContextVar set; nothing is serialised unless recorded.
    """
    token = _TURN_MESSAGES.set(messages)
    try:
        yield
    finally:
        _TURN_MESSAGES.reset(token)


def _tool_call_part(call: Mapping[str, Any]) -> dict[str, Any]:
    nested = call.get("function")
    function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else call
    arguments: Any = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # keep the model's (invalid) text as it was
    return {"type": "tool_call", "id": call.get("id"), "name": str(function.get("name", "")),
            "arguments": arguments}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # OpenAI content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def genai_input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style chat messages in the GenAI semantic conventions' input-message format.

    ``{"role": "user", "content": "hi"}`` -> ``{"role": "user", "parts": [{"type": "text",
    "content": "hi"}]}``; assistant ``tool_calls`` -> ``tool_call`` parts (arguments parsed from
    JSON where they are JSON); a ``tool`` message -> a ``tool_call_response`` part.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role", "user"))
        text = _text_of(message.get("content"))
        parts: list[dict[str, Any]] = []
        if role == "tool":
            parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                          "response": text})
        elif text:
            parts.append({"type": "text", "content": text})
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                parts.append(_tool_call_part(call))
        out.append({"role": role, "parts": parts})
    return out


def genai_output_messages(text: str | None, finish_reason: str | None,
                          tool_calls: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """One model answer (one choice) in the GenAI output-message format."""
    parts: list[dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    parts += [_tool_call_part(call) for call in tool_calls if isinstance(call, Mapping)]
    return [{"role": "assistant", "parts": parts, "finish_reason": finish_reason or "stop"}]


def _capturing() -> bool:
    return otel_verl.is_recording() and otel_verl.RolloutTraceConfig.get_config().capture_payloads


class EngineError(RuntimeError):
    """The engine answered with an error status or an answer this client cannot read."""


@dataclass
class TokenOutput:
    """One generation: token ids (and logprobs if asked for), like verl's ``TokenOutput``."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    response_id: str | None = None
    text: str | None = None


@dataclass
class ChatOutput:
    """One chat completion: assistant content, parsed tool calls (if the server parsed any)."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    response_id: str | None = None
    token_ids: list[int] | None = None


def _max_tokens(sp: Mapping[str, Any]) -> int | None:
    value = sp.get("max_tokens", sp.get("max_new_tokens"))
    return None if value is None else int(value)


class AsyncLLMClient:
    """Base: connection pool, the GenAI attributes of each request's span, the trace headers.

    Args:
        base_url: the engine's address, e.g. ``http://127.0.0.1:8000``.
        model: the served model name (goes into the request and the span name).
        timeout_s: per-request timeout.
        max_connections: size of the connection pool.
        headers: extra headers for every request (e.g. an API key).
        tokenizer: optional; with ``token2text`` on, the traced ``generate`` output gets the
            decoded prompt/response text (otel_verl reads ``self.tokenizer``).
    """

    provider = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 120.0,
        max_connections: int = 64,
        headers: Mapping[str, str] | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._headers = dict(headers or {})
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def http(self) -> httpx.AsyncClient:
        """The pooled client, created on first use (inside the running event loop)."""
        if self._http is None or self._http.is_closed:
            self._http = httpx.AsyncClient(
                base_url=self.base_url,
                timeout=self._timeout,
                limits=self._limits,
                headers=self._headers,
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> AsyncLLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- tracing helpers -------------------------------------------------------------------------
    def _llm_request(self, sp: Mapping[str, Any], conversation_id: str | None,
                     messages: Sequence[Mapping[str, Any]] | None = None) -> Span | None:
        """The GenAI request attributes on the call's own span (the ``generate``/``chat`` op,
        current here); None when nothing is recorded.

        ``messages`` (or, for token-in clients, the ones named by ``chat_messages``) become
        ``gen_ai.input.messages`` when payloads are captured.
        """
        if not otel_verl.is_recording():
            return None
        span = otel_trace.get_current_span()
        if not span.is_recording():
            return None
        attrs: dict[str, Any] = {
            semconv.GEN_AI_OPERATION_NAME: GenAIOperation.CHAT,
            semconv.GEN_AI_PROVIDER_NAME: self.provider,
            semconv.GEN_AI_REQUEST_MODEL: self.model,
        }
        attrs.update(semconv.genai_request_attributes(sp))
        if conversation_id:
            attrs[semconv.GEN_AI_CONVERSATION_ID] = conversation_id
        if messages is None:
            messages = _TURN_MESSAGES.get()
        if messages is not None and _capturing():
            # what the call appends to the trajectory's previous one (docs/content.md)
            attrs.update(input_messages_attrs(messages, genai_input_messages))
        merge_clean(span, clean_attributes(attrs))  # one insert, no per-key re-validation
        return span

    @staticmethod
    def _finish_span(
        span: Span | None,
        *,
        finish_reason: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        response_id: str | None,
        response_model: str | None,
        output_text: str | None = None,
        tool_calls: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        if span is None or not span.is_recording():
            return
        # the id of input messages hashed off the loop (a long first turn), now that it is known
        attrs: dict[str, Any] = settle_messages(span)
        if (output_text is not None or tool_calls) and _capturing():
            attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = otel_verl.payload_json(
                genai_output_messages(output_text, finish_reason, tool_calls))
        if finish_reason:
            attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = (finish_reason,)  # as stored
        if prompt_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = int(prompt_tokens)
        if completion_tokens is not None:
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = int(completion_tokens)
        if response_id:
            attrs[semconv.GEN_AI_RESPONSE_ID] = str(response_id)
        if response_model:
            attrs[semconv.GEN_AI_RESPONSE_MODEL] = str(response_model)
        merge_clean(span, clean_attributes(attrs))

    def _request_headers(self) -> dict[str, str]:
        """W3C headers of the current span (the call's span): how the engine joins the trace."""
        return otel_verl.traceparent_headers()

    async def _post(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> dict[str, Any]:
        response = await self.http.post(path, json=body, headers=dict(headers))
        if response.status_code >= 400:
            raise EngineError(
                f"{self.provider} {path} answered {response.status_code}: {response.text[:500]}"
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise EngineError(f"{self.provider} {path} answered non-JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise EngineError(f"{self.provider} {path} answered {type(data).__name__}, not object")
        return data


class AsyncTokenClient(AsyncLLMClient):
    """Token in, token out: verl's ``generate(request_id, *, prompt_ids, sampling_params)``."""

    @otel_verl.rollout_trace_op(kind=SpanKindName.LLM, span_kind=SpanKind.CLIENT)
    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids``; ``request_id`` is the trajectory's id.

        A list is handed to the engine as it is, not copied (a context-long copy per turn is
        what every young GC collection during the call would scan); ``_generate`` reads it
        during the call and keeps no reference to it (the caller may extend it in place).
        """
        span = self._llm_request(sampling_params, request_id)
        ids = prompt_ids if type(prompt_ids) is list else list(prompt_ids)
        out = await self._generate(request_id, ids, sampling_params, self._request_headers())
        if span is not None:
            self._finish_span(
                span,
                finish_reason=out.finish_reason,
                prompt_tokens=out.prompt_tokens if out.prompt_tokens is not None
                else len(prompt_ids),
                completion_tokens=out.completion_tokens if out.completion_tokens is not None
                else len(out.token_ids),
                response_id=out.response_id,
                response_model=self.model,
                output_text=self._output_text(out) if _capturing() else None,
            )
        return out

    def _output_text(self, out: TokenOutput) -> str | None:
        """The answer's text: the engine's, else the tokenizer's decoding (None without either)."""
        if out.text is not None:
            return out.text
        if self.tokenizer is None:
            return None
        try:
            return str(self.tokenizer.decode(out.token_ids, skip_special_tokens=True))
        except Exception:  # noqa: BLE001 - a tokenizer problem must not fail the generation
            return None

    async def _generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sp: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> TokenOutput:  # pragma: no cover - abstract
        raise NotImplementedError


def _vllm_sampling(sp: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key in ("temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty"):
        if sp.get(key) is not None:
            body[key] = sp[key]
    max_tokens = _max_tokens(sp)
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if sp.get("structured_outputs"):
        body["structured_outputs"] = dict(sp["structured_outputs"])
    return body


def _first_choice_tokens(data: dict[str, Any], what: str) -> tuple[dict[str, Any], list[int]]:
    """The first choice of a vLLM answer and its token ids (EngineError when they are missing)."""
    try:
        choice = data["choices"][0]
        return choice, [int(t) for t in choice["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"{what} answer without token_ids: {exc!r}") from exc


class VLLMCompletionsClient(AsyncTokenClient):
    """vLLM ``/v1/completions`` with a token-id prompt and ``return_token_ids`` (no server flag)."""

    provider = "vllm"

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Mapping[str, Any],
                        headers: Mapping[str, str]) -> TokenOutput:
        body = {"model": self.model, "prompt": prompt_ids, "return_token_ids": True}
        body.update(_vllm_sampling(sp))
        if sp.get("logprobs"):
            body["logprobs"] = 0  # the sampled token's logprob only
        body["skip_special_tokens"] = False
        data = await self._post("/v1/completions", body, headers)
        choice, token_ids = _first_choice_tokens(data, "vllm completions")
        log_probs = None
        lp = choice.get("logprobs")
        if sp.get("logprobs") and isinstance(lp, dict) and lp.get("token_logprobs") is not None:
            log_probs = [float(x) if x is not None else 0.0 for x in lp["token_logprobs"]]
        usage = data.get("usage") or {}
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            response_id=data.get("id"),
            text=choice.get("text"),
        )


class VLLMGenerateClient(AsyncTokenClient):
    """vLLM ``/inference/v1/generate`` (exists only when the server has ``--enable-scale-out``)."""

    provider = "vllm"

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Mapping[str, Any],
                        headers: Mapping[str, str]) -> TokenOutput:
        sampling = _vllm_sampling(sp)
        if sp.get("logprobs"):
            sampling["logprobs"] = 0
        body = {"model": self.model, "token_ids": prompt_ids, "sampling_params": sampling}
        data = await self._post("/inference/v1/generate", body, headers)
        choice, token_ids = _first_choice_tokens(data, "vllm generate")
        log_probs = _generate_logprobs(choice.get("logprobs")) if sp.get("logprobs") else None
        usage = data.get("usage") or {}
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens", len(prompt_ids)),
            completion_tokens=usage.get("completion_tokens", len(token_ids)),
            response_id=data.get("request_id") or data.get("id"),
        )


def _generate_logprobs(lp: Any) -> list[float] | None:
    """``/inference/v1/generate`` logprobs: ``{"content": [{"logprob": x}, ...]}`` or a list."""
    if isinstance(lp, dict):
        lp = lp.get("content", lp.get("token_logprobs"))
    if not isinstance(lp, list):
        return None
    out: list[float] = []
    for item in lp:
        if isinstance(item, dict):
            out.append(float(item.get("logprob", 0.0)))
        elif isinstance(item, (int, float)):
            out.append(float(item))
        else:
            return None
    return out


def _sglang_sampling(sp: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key in ("temperature", "top_p", "top_k", "stop", "repetition_penalty"):
        if sp.get(key) is not None:
            body[key] = sp[key]
    if sp.get("seed") is not None:
        body["sampling_seed"] = sp["seed"]
    max_tokens = _max_tokens(sp)
    if max_tokens is not None:
        body["max_new_tokens"] = max_tokens
    so = sp.get("structured_outputs") or {}
    if "regex" in so:
        body["regex"] = so["regex"]
    elif "json" in so:
        schema = so["json"]
        body["json_schema"] = schema if isinstance(schema, str) else json.dumps(schema)
    elif "grammar" in so:
        body["ebnf"] = so["grammar"]
    body["skip_special_tokens"] = False
    return body


class SGLangClient(AsyncTokenClient):
    """SGLang native ``/generate`` with ``input_ids``.

    SGLang reads the trace context from ``GenerateReqInput.external_trace_header`` first and from
    the HTTP ``traceparent``/``tracestate`` headers otherwise (``--enable-trace`` on the server);
    this client sends both, so it works with either code path.
    """

    provider = "sglang"

    async def _generate(self, request_id: str, prompt_ids: list[int], sp: Mapping[str, Any],
                        headers: Mapping[str, str]) -> TokenOutput:
        body: dict[str, Any] = {
            "input_ids": prompt_ids,
            "sampling_params": _sglang_sampling(sp),
            "return_logprob": bool(sp.get("logprobs")),
            "stream": False,
            # a rid must be unique while in flight; keep the trajectory id as its prefix
            "rid": f"{request_id}-{uuid.uuid4().hex[:12]}",
        }
        if headers:
            body["external_trace_header"] = dict(headers)
        data = await self._post("/generate", body, headers)
        meta = data.get("meta_info") or {}
        try:
            token_ids = [int(t) for t in data["output_ids"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"sglang /generate answer without output_ids: {exc!r}") from exc
        log_probs = None
        if sp.get("logprobs") and isinstance(meta.get("output_token_logprobs"), list):
            log_probs = [float(item[0]) for item in meta["output_token_logprobs"]]
        finish = meta.get("finish_reason")
        finish_reason = finish.get("type") if isinstance(finish, dict) else finish
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=finish_reason,
            prompt_tokens=meta.get("prompt_tokens"),
            completion_tokens=meta.get("completion_tokens"),
            response_id=meta.get("id"),
            text=data.get("text"),
        )


class OpenAIChatClient(AsyncLLMClient):
    """``/v1/chat/completions`` on vLLM (``provider="vllm"``) or SGLang (``provider="sglang"``).

    Messages in, assistant message out (the server applies the chat template and, when started
    with a tool-call parser, returns parsed ``tool_calls``).
    """

    def __init__(self, base_url: str, model: str, *, provider: str = "vllm", **kwargs: Any):
        super().__init__(base_url, model, **kwargs)
        self.provider = provider

    @otel_verl.rollout_trace_op(kind=SpanKindName.LLM, span_kind=SpanKind.CLIENT)
    async def chat(
        self,
        request_id: str,
        *,
        messages: list[dict[str, Any]],
        sampling_params: dict[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatOutput:
        """One chat completion for ``messages``; ``request_id`` is the conversation id."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        so = sampling_params.get("structured_outputs")
        if self.provider == "sglang":
            sampling = _sglang_sampling(sampling_params)
            sampling.pop("skip_special_tokens", None)
            if "max_new_tokens" in sampling:
                sampling["max_tokens"] = sampling.pop("max_new_tokens")
            if "sampling_seed" in sampling:
                sampling["seed"] = sampling.pop("sampling_seed")
            body.update(sampling)
        else:
            body.update(_vllm_sampling(sampling_params))
            body["return_token_ids"] = True
        if tools:
            body["tools"] = tools
            body["tool_choice"] = sampling_params.get("tool_choice", "auto")
        if so and self.provider != "sglang":
            body["structured_outputs"] = dict(so)
        span = self._llm_request(sampling_params, request_id, messages)
        data = await self._post("/v1/chat/completions", body, self._request_headers())
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"chat answer without choices[0].message: {exc!r}") from exc
        usage = data.get("usage") or {}
        out = ChatOutput(
            content=message.get("content") or "",
            tool_calls=list(message.get("tool_calls") or []),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            response_id=data.get("id"),
            token_ids=choice.get("token_ids"),
        )
        self._finish_span(
            span,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            response_id=out.response_id,
            response_model=data.get("model"),
            output_text=out.content,
            tool_calls=out.tool_calls,
        )
        return out
