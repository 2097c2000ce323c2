"""A traced worker process for the kill tests.

    python _traced_child.py record TRACE_DIR ENDPOINT PROTOCOL PROGRESS_FILE RATE
        records spans (``rollout_trace_attr`` + ``rollout_trace_op``) at about RATE per second
        until it is killed; after each span ended it appends "<span id hex> <monotonic time>" to
        PROGRESS_FILE (unbuffered), so the test knows what was recorded and when.
    python _traced_child.py drain TRACE_DIR ENDPOINT PROTOCOL
        the next process with the same trace dir and backend: starts tracing, waits until the
        log an earlier process left is delivered (at most 30 s), prints its stats as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr


def _init(trace_dir: str, endpoint: str, protocol: str) -> None:
    RolloutTraceConfig.init("faults", "kill", "otlp", trace_dir=trace_dir, otlp_endpoint=endpoint,
                            otlp_protocol=protocol, export_timeout_s=2.0)


def record(trace_dir: str, endpoint: str, protocol: str, progress: str, rate: float) -> None:
    _init(trace_dir, endpoint, protocol)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    tracer = get_tracer()
    period = 1.0 / rate
    next_at = time.monotonic()
    os.write(fd, b"ready 0\n")
    step = 0
    while True:
        with rollout_trace_attr(step=step, sample_index=step % 8, rollout_n=0, name="traj"):
            with tracer.start_as_current_span("turn", attributes={"input.value": "x" * 200}) as s:
                pass
            os.write(fd, f"{s.get_span_context().span_id:016x} {time.monotonic()}\n".encode())
        step += 1
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))


def drain(trace_dir: str, endpoint: str, protocol: str) -> None:
    _init(trace_dir, endpoint, protocol)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = RolloutTraceConfig.stats()
        if stats.get("recovered", 0) and RolloutTraceConfig.flush(1.0):
            break
        time.sleep(0.2)
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(5.0)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(*sys.argv[2:6], float(sys.argv[6]))
    else:
        drain(*sys.argv[2:5])
