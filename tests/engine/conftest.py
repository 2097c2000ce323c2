"""Engine tier: a real vLLM (CPU build) server with tracing on, started once per session.

The server exports its ``llm_request`` spans over OTLP/HTTP to a receiver this session runs on
127.0.0.1 (``otel_verl.demo.otlp_receiver``); tests point the rollout's own spans
(``backend=otlp``) at the same receiver, so both sides of a trajectory meet in one place.
Everything is time-bound (server startup, waits, per-test timeouts) and the server's whole
process group is killed on teardown.
"""

from __future__ import annotations

import os

import pytest

from otel_verl.demo.otlp_receiver import OTLPReceiver
from otel_verl.demo.server import VLLMServer
from otel_verl.demo.tiny_model import build_tiny_model

MODEL = "tiny-qwen2"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    cache = os.environ.get("OTEL_VERL_MODEL_CACHE")
    if cache:
        return build_tiny_model(os.path.join(cache, "engine-tests"))
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def receiver():
    with OTLPReceiver() as r:
        yield r


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, receiver, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(
        tiny_model_dir,
        served_model_name=MODEL,
        otlp_endpoint=receiver.traces_url,
        otlp_protocol="http/protobuf",
        service_name="vllm-engine-test",
        # /inference/v1/generate too, and hermes tool-call parsing on chat completions
        extra_args=["--enable-scale-out", "--enable-auto-tool-choice", "--tool-call-parser",
                    "hermes"],
        startup_timeout_s=float(os.environ.get("OTEL_VERL_VLLM_STARTUP_TIMEOUT", "300")),
        log_path=log,
    )
    server.start()
    try:
        yield server
    finally:
        code = server.stop()
        print(f"\nvLLM startup {server.startup_s:.1f}s, exit code {code}, log {log}")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
