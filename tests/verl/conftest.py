"""verl tier: the real verl package (0.9.1) with otel_verl's integration installed.

The integration is installed here, before any test module imports verl, as ``opentelemetry-instrument``
or a Ray worker's bootstrap would do it; the late-install and fresh-process paths run in subprocesses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from otel_verl.integrations.verl import install

install(propagate=False)  # must precede the first ``import verl`` in this process

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # _harness, verl_test_tools (imported by verl's tool registry)

for _k, _v in {
    "WANDB_DISABLE_WEAVE": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WEAVE_PRINT_CALL_LINK": "false",
    "WEAVE_ENABLE_DISK_FALLBACK": "false",
    "WANDB_SILENT": "true",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)

_OURS = ("OTEL_VERL_BACKEND", "OTEL_VERL_TRACE_DIR", "OTEL_VERL_TOKEN2TEXT", "OTEL_VERL_CONFIG",
         "OTEL_VERL_MAX_SAMPLES_PER_STEP_PER_WORKER", "OTEL_VERL_PROCESSOR",
         "OTEL_VERL_WEAVE_BASE_URL", "OTEL_VERL_WEAVE_ENTITY", "WANDB_API_KEY", "WANDB_ENTITY",
         "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
         "OTEL_EXPORTER_WEAVE_KEEP_TRAJECTORY")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    for name in _OURS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_VERL_TRACE_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("OTEL_VERL_PROCESSOR", "simple")
    try:
        from verl.utils.rollout_trace import RolloutTraceConfig
    except ImportError:  # the vLLM engine check runs in the engine tier's venv, without verl
        from otel_verl import RolloutTraceConfig

    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from _harness import model_dir

    return model_dir()
