"""A traced worker process for the kill tests.

    python _traced_child.py record TRACE_DIR ENDPOINT PROTOCOL PROGRESS_FILE RATE
        records spans (``rollout_trace_attr`` + ``rollout_trace_op``) at about RATE per second
        until it is killed; after each span ended it appends "<span id hex> <monotonic time>" to
        PROGRESS_FILE (unbuffered), so the test knows what was recorded and when.
    python _traced_child.py step TRACE_DIR ENDPOINT PROTOCOL PROGRESS_FILE IDLE_S
        one step's rollouts (16 concurrent trajectories of 3 turns) with 5 s export delays, then
        "done <time>" in PROGRESS_FILE, then IDLE_S seconds of other work, then SIGKILL by itself:
        how Ray ends a verl worker at the end of a run (no exit hooks)
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


def step(trace_dir: str, endpoint: str, protocol: str, progress: str, idle_s: float) -> None:
    import asyncio
    import signal

    # both waits (the processor's batch and the durable log's request) far longer than idle_s:
    # only the export at the end of the step's rollouts can deliver in time
    RolloutTraceConfig.init("faults", "step", "otlp", trace_dir=trace_dir, otlp_endpoint=endpoint,
                            otlp_protocol=protocol, export_timeout_s=2.0, schedule_delay_s=5.0,
                            export_delay_s=5.0)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"ready 0\n")
    tracer = get_tracer()

    async def trajectory(i: int) -> None:
        with rollout_trace_attr(step=1, sample_index=i, rollout_n=0, name="traj") as root:
            for turn in range(3):
                with tracer.start_as_current_span(f"turn{turn}") as s:
                    await asyncio.sleep(0.02 * (1 + i % 4))
                os.write(fd, f"{s.get_span_context().span_id:016x} {time.monotonic()}\n".encode())
        os.write(fd, f"{root.get_span_context().span_id:016x} {time.monotonic()}\n".encode())

    async def rollouts() -> None:
        await asyncio.gather(*(trajectory(i) for i in range(16)))

    asyncio.run(rollouts())
    os.write(fd, f"done {time.monotonic()}\n".encode())
    time.sleep(idle_s)  # the trainer's update
    os.kill(os.getpid(), signal.SIGKILL)


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
    elif sys.argv[1] == "step":
        step(*sys.argv[2:6], float(sys.argv[6]))
    else:
        drain(*sys.argv[2:5])
