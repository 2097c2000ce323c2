"""Note every request vLLM's engine takes, with the trace context it came with (test infrastructure).

Loaded by ``import verl`` itself in every process of a run (``VERL_USE_EXTERNAL_MODULES=
verl_cpu_platform,e2e_engine_prompts``), it does something only where ``OTEL_VERL_E2E_ENGINE_PROMPTS``
names a folder: a post-import hook on ``vllm.v1.engine.async_llm`` wraps ``AsyncLLM.add_request``
(the engine's entry, below ``AsyncLLM.generate``; verl's vLLM server actor calls it for every turn)
and appends one JSON line per request to ``<folder>/<pid>.jsonl``: the prompt token ids the engine
received and the ``traceparent`` it received them with (``trace_headers``, present when vLLM's own
tracing is on). The e2e test matches them to the traced ``LLMServerClient.generate`` calls.

Nothing here is part of otel_verl.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
from types import ModuleType
from typing import Any

ENV = "OTEL_VERL_E2E_ENGINE_PROMPTS"
MODULE = "vllm.v1.engine.async_llm"
_LOCK = threading.Lock()


def _prompt_ids(prompt: Any) -> list[int] | None:
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(
        prompt, "prompt_token_ids", None)
    return [int(t) for t in ids] if ids is not None else None


def _wrap(module: ModuleType) -> None:
    engine = getattr(module, "AsyncLLM", None)
    original = getattr(engine, "add_request", None)
    if original is None or getattr(original, "__e2e_prompts__", False):
        return
    folder = os.environ[ENV]

    @functools.wraps(original)
    async def add_request(self: Any, request_id: str, prompt: Any, *args: Any,
                          **kwargs: Any) -> Any:
        try:
            headers = kwargs.get("trace_headers") or {}
            line = json.dumps({"request_id": str(request_id), "prompt_token_ids": _prompt_ids(prompt),
                               "traceparent": headers.get("traceparent")})
            with _LOCK, open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(line + "\n")
        except Exception as exc:  # noqa: BLE001 - a test note must never break the engine
            print(f"e2e_engine_prompts: {exc!r}", file=sys.stderr)
        return await original(self, request_id, prompt, *args, **kwargs)

    add_request.__e2e_prompts__ = True  # type: ignore[attr-defined]
    engine.add_request = add_request


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _wrap(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if not os.environ.get(ENV) or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    os.makedirs(os.environ[ENV], exist_ok=True)
    if MODULE in sys.modules:
        _wrap(sys.modules[MODULE])
    sys.meta_path.insert(0, _Finder())


def read(folder: str) -> list[dict[str, Any]]:
    """Every request noted under ``folder``, in no particular order."""
    out: list[dict[str, Any]] = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        with open(os.path.join(folder, name)) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


install()
