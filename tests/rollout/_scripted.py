"""A char-level ChatML tokenizer and a scripted engine client: a rollout without an engine.

Shared by the rollout unit tests (through conftest.py) and the phoenix tier (which imports this
file by path). Only httpx and otel_verl are needed: no torch, no transformers, no engine.
"""

from __future__ import annotations

import json
from typing import Any

from otel_verl.rollout.clients import AsyncTokenClient, TokenOutput

SPECIALS = {"<|endoftext|>": 0, "<|im_end|>": 1, "<|im_start|>": 2}
_BY_ID = {v: k for k, v in SPECIALS.items()}
_OFFSET = 100


class CharTokenizer:
    """One token per character (id = ord + 100); ChatML specials are single tokens."""

    eos_token_id = SPECIALS["<|im_end|>"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for token, tid in SPECIALS.items():
                if text.startswith(token, i):
                    ids.append(tid)
                    i += len(token)
                    break
            else:
                ids.append(ord(text[i]) + _OFFSET)
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = []
        for tid in ids:
            if tid in _BY_ID:
                if not skip_special_tokens:
                    out.append(_BY_ID[tid])
            else:
                out.append(chr(tid - _OFFSET))
        return "".join(out)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True,
                            tokenize=False, **_: Any) -> str:
        text = ""
        if tools:
            text += "<|im_start|>system\n" + "\n".join(json.dumps(t) for t in tools) + "<|im_end|>\n"
        for m in messages:
            if m["role"] == "tool":
                text += f"<|im_start|>tool\n<tool_response>{m['content']}</tool_response><|im_end|>\n"
            else:
                text += f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        assert not tokenize
        return text


class ScriptedClient(AsyncTokenClient):
    """Answers each turn with the next scripted text (+ eos unless the script item says no)."""

    provider = "fake"

    def __init__(self, tokenizer: CharTokenizer, script: list[str | tuple[str, bool]]):
        super().__init__("http://127.0.0.1:9", "fake-model")
        self.tokenizer = tokenizer
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    async def _generate(self, request_id, prompt_ids, sp, headers) -> TokenOutput:
        self.requests.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                              "sampling_params": dict(sp), "headers": dict(headers)})
        item = self.script.pop(0) if self.script else "I give up."
        text, eos = (item, True) if isinstance(item, str) else item
        ids = self.tokenizer.encode(text)[: sp.get("max_tokens", 10**9)]
        finish = "stop"
        if eos and len(ids) < sp.get("max_tokens", 10**9):
            ids.append(self.tokenizer.eos_token_id)
        else:
            finish = "length"
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), finish_reason=finish,
                           prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                           response_id=f"resp-{len(self.requests)}")
