"""The phoenix tier: a real Phoenix server, a real traced rollout sent to it over OTLP, read back
through Phoenix's own REST and GraphQL APIs, and Phoenix's UI in a real headless Chromium.

The rollout is otel_verl's own ``ToolAgentLoop`` (hermes tool calls, calculator tool, GSM8K
reward) against the scripted engine client of the rollout unit tests (``tests/rollout/_scripted.py``:
a char-level ChatML tokenizer and scripted model turns), traced with ``backend=otlp`` (OTLP/HTTP)
to Phoenix's collector. Artifacts (screenshots, page texts, server and browser logs) go to
``$OTEL_VERL_PHOENIX_ARTIFACTS`` (default ``.artifacts/phoenix``); the run's last lines name
the folder.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for path in (HERE, ROOT / "tests" / "rollout"):  # --import-mode=importlib: helpers by path
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from _phoenix_server import PhoenixServer  # noqa: E402
from _rollout_plan import (  # noqa: E402
    DROPIN_PROJECT,
    EXPERIMENT,
    PROJECT,
    TRAJECTORIES,
    Rollout,
    run_all,
)

from otel_verl import RolloutTraceConfig  # noqa: E402

ARTIFACTS = Path(os.environ.get("OTEL_VERL_PHOENIX_ARTIFACTS", ROOT / ".artifacts" / "phoenix"))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def phoenix(artifacts: Path, tmp_path_factory: pytest.TempPathFactory):
    started = time.monotonic()
    with PhoenixServer(tmp_path_factory.mktemp("phoenix-workdir"),
                       artifacts / "phoenix-server.log") as server:
        print(f"\nphoenix {server.version} up at {server.url} in "
              f"{time.monotonic() - started:.1f}s")
        yield server


@pytest.fixture(scope="session")
def rollout(phoenix: PhoenixServer) -> Rollout:
    """Send the rollout to Phoenix with backend=otlp and wait until Phoenix stored all of it."""
    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(PROJECT, EXPERIMENT, "otlp", otlp_endpoint=phoenix.url,
                            otlp_protocol="http/protobuf", schedule_delay_s=0.2,
                            trace_dir=str(ARTIFACTS / "otel_verl_traces"))
    started = time.monotonic()
    outputs = asyncio.run(run_all())
    assert RolloutTraceConfig.flush(30)
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(30)
    RolloutTraceConfig.reset()
    expected = sum(sum(t.span_kinds.values()) for t in TRAJECTORIES)
    deadline = time.monotonic() + 120
    stored = -1
    while time.monotonic() < deadline:  # Phoenix inserts OTLP spans from a queue, in batches
        data = phoenix.graphql("query($n: String!) { getProjectByName(name: $n) { recordCount } }",
                               n=PROJECT)
        stored = (data["getProjectByName"] or {}).get("recordCount", -1)
        if stored >= expected:
            break
        time.sleep(0.5)
    assert stored == expected, f"phoenix stored {stored} spans of {expected}"
    return Rollout(TRAJECTORIES, stats, time.monotonic() - started, outputs)


@pytest.fixture(scope="session")
def dropin_rollout(phoenix: PhoenixServer) -> Any:
    """verl's drop-in API (no set_trajectory_*), sent to its own Phoenix project."""
    import _dropin_agent as d

    RolloutTraceConfig.reset()
    RolloutTraceConfig.init(DROPIN_PROJECT, d.EXPERIMENT, "otlp", otlp_endpoint=phoenix.url,
                            otlp_protocol="http/protobuf", schedule_delay_s=0.2,
                            trace_dir=str(ARTIFACTS / "otel_verl_traces_dropin"))
    asyncio.run(d.run_all())
    assert RolloutTraceConfig.shutdown(30)
    RolloutTraceConfig.reset()
    expected = sum(s.spans for s in d.SAMPLES)
    deadline = time.monotonic() + 120
    stored = -1
    while time.monotonic() < deadline:
        data = phoenix.graphql("query($n: String!) { getProjectByName(name: $n) { recordCount } }",
                               n=DROPIN_PROJECT)
        stored = (data["getProjectByName"] or {}).get("recordCount", -1)
        if stored >= expected:
            break
        time.sleep(0.5)
    assert stored == expected, f"phoenix stored {stored} spans of {expected}"
    return d.SAMPLES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if ARTIFACTS.exists():
        files = sorted(p.name for p in ARTIFACTS.iterdir() if p.is_file())
        terminalreporter.write_line(f"phoenix artifacts (screenshots, logs): {ARTIFACTS}")
        for name in files:
            terminalreporter.write_line(f"  {ARTIFACTS / name}")
