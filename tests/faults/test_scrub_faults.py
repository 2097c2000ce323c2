"""Redaction under load, on real files, sockets and processes: token-like payloads (base64 images,
hex, one repeated character) lose nothing at a normal shutdown, and a catastrophic user pattern
cannot freeze the process.

Before the linear-time pass, redaction ran at ~2-8 MB/s on such content: the export thread fell
behind and a bounded shutdown abandoned most of the backlog, and ``(a+)+$`` in
``redact_patterns`` froze every thread, ``shutdown(5)`` included, for more than a minute.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _receiver import FaultyReceiver

from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr
from otel_verl.store import ReadStats, read_spans

ROOT = Path(__file__).resolve().parents[2]
SPANS = 300
FIELD = 128 * 1024


def payloads(kind: str, n: int) -> list[str]:
    """``n`` distinct ``FIELD``-character payloads (distinct, so the content cache cannot help)."""
    rng = random.Random(kind)
    if kind == "base64":
        base = "data:image/png;base64," + base64.b64encode(rng.randbytes(FIELD * 3 // 4)).decode()
    elif kind == "hex":
        base = rng.randbytes(FIELD // 2).hex()
    else:
        base = "x" * FIELD
    return [base[:8] + f"{i:08d}" + base[16:FIELD] for i in range(n)]


def record(fields: list[str]) -> set[str]:
    tracer = get_tracer()
    ids = set()
    with rollout_trace_attr(step=0, sample_index=0, rollout_n=0, name="traj"):
        for i, field in enumerate(fields):
            with tracer.start_as_current_span(f"turn{i}", attributes={"input.value": field}) \
                    as span:
                pass
            ids.add(f"{span.get_span_context().span_id:016x}")
    return ids


def stored_ids(trace_dir: Path) -> set[str]:
    stats = ReadStats()
    ids = {s["span_id"] for s in read_spans(trace_dir, stats=stats, warn=False)
           if "turn" in s.get("name", "")}
    assert stats.bad_lines == 0
    return ids


@pytest.mark.parametrize("kind", ["base64", "hex", "repeated"])
@pytest.mark.parametrize("backend", ["file", "otlp"])
def test_token_like_payloads_lose_nothing_at_a_normal_shutdown(backend, kind, tmp_path, figure):
    fields = payloads(kind, SPANS)
    trace_dir = tmp_path / "traces"
    with FaultyReceiver("grpc") as receiver:
        options = {"otlp_endpoint": receiver.endpoint, "otlp_protocol": "grpc"} \
            if backend == "otlp" else {}
        RolloutTraceConfig.init("faults", "scrub", backend, trace_dir=str(trace_dir),
                                export_timeout_s=2.0, **options)
        start = time.monotonic()
        ids = record(fields)
        RolloutTraceConfig.shutdown()  # the default bound
        seconds = time.monotonic() - start
        got = receiver.ids() if backend == "otlp" else stored_ids(trace_dir)
        RolloutTraceConfig.reset()
    lost = len(ids - got)
    figure(fault=f"{backend}: {SPANS} spans x {FIELD >> 10} KiB {kind}", recorded=len(ids),
           received=len(ids & got), lost=lost, allowed=0, seconds=round(seconds, 1),
           note="healthy backend, shutdown right after")
    assert lost == 0
    # redaction did run on that content (nothing in it is a secret: it arrives unchanged)
    if backend == "file":
        data = b"".join(p.read_bytes() for p in trace_dir.rglob("*.jsonl"))
        assert fields[-1][16:1000].encode() in data


WRITER = textwrap.dedent("""
    import sys
    from opentelemetry import trace
    from otel_verl import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op
    trace_dir, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    RolloutTraceConfig.init("faults", "writers", "file", trace_dir=trace_dir)
    ids = []

    @rollout_trace_op
    def turn(prompt, tools):  # input and output: 'x' * 2000 each, several times
        ids.append(f"{trace.get_current_span().get_span_context().span_id:016x}")
        return {"text": prompt, "tool_result": tools[0]}

    with rollout_trace_attr(step=0, sample_index=0, rollout_n=0, name="traj"):
        for i in range(n):
            turn("x" * 2000, ["x" * 2000])
    ok = RolloutTraceConfig.shutdown()
    open(out, "w").write("\\n".join(ids))
    print("shutdown", ok)
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_sixteen_file_writers_on_one_trace_dir_lose_nothing(tmp_path, figure):
    trace_dir = tmp_path / "traces"
    per_writer = 800
    start = time.monotonic()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(trace_dir), str(per_writer),
                                 str(tmp_path / f"ids{n}")], env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for n in range(16)]
    outputs = [w.communicate(timeout=240)[0] for w in writers]
    assert all(w.returncode == 0 for w in writers), outputs
    ids = set()
    for n in range(16):
        ids |= set((tmp_path / f"ids{n}").read_text().split())
    got = stored_ids(trace_dir)
    lost = len(ids - got)
    figure(fault=f"file: 16 writers x {per_writer} ops, 'x' * 2000 in and out", recorded=len(ids),
           received=len(ids & got), lost=lost, allowed=0,
           seconds=round(time.monotonic() - start, 1), note="one trace dir")
    assert len(ids) == 16 * per_writer and lost == 0


CATASTROPHIC = textwrap.dedent("""
    import json, sys, time
    from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr
    trace_dir = sys.argv[1]
    RolloutTraceConfig.init("faults", "pattern", "file", trace_dir=trace_dir,
                            redact_patterns=["(a+)+$"])
    tracer = get_tracer()
    with rollout_trace_attr(step=0, sample_index=0, rollout_n=0, name="traj"):
        for i in range(20):
            with tracer.start_as_current_span("turn", attributes={"note": "a" * 60 + "b"}):
                pass
    began = time.monotonic()
    ok = RolloutTraceConfig.shutdown(5)
    print(json.dumps({"shutdown_s": time.monotonic() - began, "ok": ok}))
""")


def test_a_catastrophic_redact_pattern_does_not_freeze_shutdown(tmp_path, figure):
    """``(a+)+$`` over ``'a' * 60 + 'b'`` is 2**60 steps for a backtracking engine."""
    trace_dir = tmp_path / "traces"
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CATASTROPHIC, str(trace_dir)], env=_env(),
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the process froze: still running after 60 s")
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stored = list(read_spans(trace_dir, warn=False))
    turns = [s for s in stored if s.get("name") in ("turn", "[REDACTED]")]
    figure(fault="catastrophic redact_patterns", recorded=20, received=len(turns),
           lost=20 - len(turns), allowed=0, seconds=round(elapsed, 1),
           note=f"shutdown(5) returned in {result['shutdown_s']:.1f} s, failed closed")
    assert result["shutdown_s"] < 20  # a bound, not a speed
    assert len(turns) == 20
    raw = b"".join(p.read_bytes() for p in trace_dir.rglob("*.jsonl"))
    assert b"a" * 60 not in raw  # what could not be checked was not exported
