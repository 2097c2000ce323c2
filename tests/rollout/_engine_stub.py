"""A protocol-faithful stub of the SGLang and vLLM HTTP APIs on 127.0.0.1 (unit tests only).

It answers in the shapes the real servers use and, like SGLang's ``TokenizerManager``, resolves
the trace context of a request: ``external_trace_header`` in a native ``/generate`` body wins,
otherwise the ``traceparent``/``tracestate`` HTTP headers are used. Each request is recorded with
the context the engine would have continued (``engine_traceparent``), so tests can check it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared stub servers
from _servers import LocalServer, QuietHandler  # noqa: E402


class EngineStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.read_body())
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, answer = stub.handle(self.path, headers, body)
                self.reply(status, json.dumps(answer).encode(), "application/json")

        self.server = LocalServer(Handler)
        self.url = self.server.url

    def __enter__(self) -> EngineStub:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()

    # -- protocol --------------------------------------------------------------------------------
    def handle(self, path: str, headers: dict[str, str], body: dict[str, Any]):
        record = {"path": path, "headers": headers, "body": body}
        self.requests.append(record)
        if path == "/generate":
            return self._sglang_generate(record)
        if path == "/v1/chat/completions":
            record["engine_traceparent"] = headers.get("traceparent")
            return 200, {
                "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "",
                    "tool_calls": [{"id": "call_a", "type": "function", "function": {
                        "name": "calculator", "arguments": "{\"expression\": \"2+3\"}"}}]}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            }
        if path == "/v1/completions":
            record["engine_traceparent"] = headers.get("traceparent")
            assert isinstance(body["prompt"], list) and body["return_token_ids"] is True
            return 200, {
                "id": "cmpl-1", "model": body["model"],
                "choices": [{"index": 0, "text": "hi", "finish_reason": "stop",
                             "token_ids": [5, 6, 2],
                             "logprobs": {"token_logprobs": [-0.1, -0.2, 0.0]}}],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3},
            }
        if path == "/inference/v1/generate":
            record["engine_traceparent"] = headers.get("traceparent")
            return 200, {
                "request_id": "generate-tokens-1",
                "choices": [{"index": 0, "finish_reason": "length", "token_ids": [7, 8],
                             "logprobs": {"content": [{"token_id": 7, "logprob": -1.0},
                                                      {"token_id": 8, "logprob": -2.0}]}}],
                "usage": {"prompt_tokens": len(body["token_ids"]), "completion_tokens": 2},
            }
        return 404, {"detail": "Not Found"}

    def _sglang_generate(self, record: dict[str, Any]):
        body, headers = record["body"], record["headers"]
        # GenerateReqInput validation, as far as a client can trip it
        if not body.get("input_ids") and not body.get("text"):
            return 400, {"error": {"message": "Either text or input_ids should be provided."}}
        if not isinstance(body.get("sampling_params"), dict) or not isinstance(body.get("rid"), str):
            return 400, {"error": {"message": "bad request"}}
        # TokenizerManager: an explicit external_trace_header wins over the HTTP headers
        carrier = body.get("external_trace_header") or {
            k: v for k, v in headers.items() if k in ("traceparent", "tracestate")}
        record["engine_traceparent"] = carrier.get("traceparent")
        n = int(body["sampling_params"].get("max_new_tokens", 3))
        ids = list(range(40, 40 + min(n, 3)))
        meta = {
            "id": body["rid"], "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(ids), "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": len(ids)} if n <= 3
            else {"type": "stop", "matched": 2},
            "e2e_latency": 0.01,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.25, t, None] for t in ids]
        return 200, {"text": "abc", "output_ids": ids, "meta_info": meta}
