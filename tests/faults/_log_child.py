"""A traced process for the damaged-log tests (test_log_damage.py).

    python _log_child.py leave TRACE_DIR ENDPOINT PROTOCOL N POISON IDS_FILE
        records N spans (and, with POISON=1, a span named "poison" last), then shuts down while
        the backend refuses: the spans stay in the durable log for the next process
    python _log_child.py drain TRACE_DIR ENDPOINT PROTOCOL N IDS_FILE FAIL_OPENS ERRNO
        the next process: opening a log segment fails FAIL_OPENS times first (-1: always) with
        ERRNO (a failing-open wrapper around builtins.open, for the segments that exist when it
        starts: the earlier process's log); records its own N spans, waits up to
        20 s until everything is delivered, shuts down, prints its stats as JSON
    python _log_child.py backlog TRACE_DIR ENDPOINT PROTOCOL N IDS_FILE
        records N spans whose redaction is slow (20 ms each), then a normal bounded shutdown
        (1 s): what the export thread did not reach goes to the durable log unredacted
The span ids recorded are written to IDS_FILE, one per line.
"""

from __future__ import annotations

import builtins
import errno as errno_module
import json
import sys
import time
from pathlib import Path

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr


def _init(trace_dir: str, endpoint: str, protocol: str) -> None:
    RolloutTraceConfig.init("faults", "damage", "otlp", trace_dir=trace_dir,
                            otlp_endpoint=endpoint, otlp_protocol=protocol, export_timeout_s=1.0,
                            schedule_delay_s=0.2, export_delay_s=0.3)


def _record(n: int, ids_file: str, poison: bool = False, payload: str = "x" * 200) -> None:
    tracer = get_tracer()
    ids = []
    with rollout_trace_attr(step=0, sample_index=0, rollout_n=0, name="traj"):
        for i in range(n):
            with tracer.start_as_current_span(f"turn{i}",
                                              attributes={"input.value": payload}) as span:
                pass
            ids.append(f"{span.get_span_context().span_id:016x}")
    if poison:  # after the trajectory's span: the last line of the log
        with tracer.start_as_current_span("poison"):
            pass
    with open(ids_file, "a") as handle:
        handle.write("".join(f"{i}\n" for i in ids))


def leave(trace_dir: str, endpoint: str, protocol: str, n: str, poison: str,
          ids_file: str) -> None:
    _init(trace_dir, endpoint, protocol)
    _record(int(n), ids_file, poison=poison == "1")
    RolloutTraceConfig.flush(1.0)
    RolloutTraceConfig.shutdown(1.0)


def drain(trace_dir: str, endpoint: str, protocol: str, n: str, ids_file: str,
          fail_opens: str, error: str) -> None:
    left = {"n": int(fail_opens)}
    real_open = builtins.open
    code = getattr(errno_module, error)
    dead = {str(p) for p in Path(trace_dir).rglob("wal-*.jsonl")}  # the earlier process's log

    def failing_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = str(file)
        if left["n"] != 0 and name in dead:
            left["n"] -= 1 if left["n"] > 0 else 0
            raise OSError(code, f"injected {error}", name)
        return real_open(file, *args, **kwargs)

    builtins.open = failing_open  # the log reads its segments with open()
    _init(trace_dir, endpoint, protocol)
    _record(int(n), ids_file)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not RolloutTraceConfig.flush(1.0):
        time.sleep(0.2)
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(2.0)
    print(json.dumps(stats), flush=True)


def backlog(trace_dir: str, endpoint: str, protocol: str, n: str, ids_file: str) -> None:
    from otel_verl._state import STATE

    _init(trace_dir, endpoint, protocol)
    runtime = STATE.runtime
    assert runtime is not None
    processor = runtime.processor
    redact = processor._transform
    assert redact is not None

    def slow(span):  # type: ignore[no-untyped-def]  # redaction at a few MB/s, as on base64
        time.sleep(0.02)
        return redact(span)

    processor._transform = slow
    _record(int(n), ids_file, payload="token=sk-" + "A" * 40 + " " + "x" * 2000)
    RolloutTraceConfig.shutdown(1.0)
    print(json.dumps(processor.stats()), flush=True)


if __name__ == "__main__":
    {"leave": leave, "drain": drain, "backlog": backlog}[sys.argv[1]](*sys.argv[2:])
