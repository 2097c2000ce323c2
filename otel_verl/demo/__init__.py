"""The demo's machinery, apart from the library users import (``otel_verl.rollout``).

- ``run``: ``otel-verl demo`` — a small GRPO-style rollout job against a real vLLM CPU engine;
- ``server``: starts and stops a vLLM OpenAI-compatible server in a subprocess;
- ``tiny_model``: builds the tiny Qwen2-shaped model and tokenizer the demo and tests serve;
- ``otlp_receiver``: a loopback OTLP/HTTP receiver that joins the engine's spans into the store.

Usage::

    otel-verl demo --help
    python -m otel_verl.demo.tiny_model [DIR]
"""
