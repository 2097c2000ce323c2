"""Token-like payloads through an outage, on real processes and sockets (issue 25, item 1): a
process traces base64 images, hex and repeated-character fields of 128-256 KiB (multimodal
prompts, tool results) through the public API with ``backend=otlp`` while its receiver hangs
(accepts, never answers) for the whole run, or stalls for a few seconds; it shuts down normally
(the default bound); the next process on the same trace dir, with the receiver healthy, delivers
what the first left in the durable log. Every span must arrive (by span id; duplicates are
allowed and counted), and the first process must have dropped nothing from its queue and
abandoned nothing at shutdown.

Before the linear-time redaction pass, the export thread fell behind on such content: the queue
filled and dropped spans, and shutdown abandoned most of the backlog ("2,663 of 3,000 lost with
128-256 KiB fields and a 3 s stall").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from _receiver import FaultyReceiver

HERE = Path(__file__).resolve().parent
PROTOCOL = "grpc"
SPANS = 1500
#: spans per second the first process records at: one rollout worker's multimodal turns, each
#: a 128-256 KiB field (~48 MB/s of payload)
RATE = 250.0
STALL_S = 3.0

RECORD = textwrap.dedent("""
    import base64, json, os, random, sys, time
    from otel_verl import RolloutTraceConfig, get_tracer, rollout_trace_attr
    trace_dir, endpoint, protocol, n, rate, out = sys.argv[1:7]
    n, rate = int(n), float(rate)
    RolloutTraceConfig.init("faults", "payload", "otlp", trace_dir=trace_dir,
                            otlp_endpoint=endpoint, otlp_protocol=protocol, export_timeout_s=2.0)
    rng = random.Random(25)
    size = 256 * 1024
    bases = {
        "base64": "data:image/png;base64,"
                  + base64.b64encode(rng.randbytes(size * 3 // 4)).decode(),
        "hex": rng.randbytes(size // 2).hex(),
        "repeated": "x" * size,
    }
    kinds = list(bases)
    tracer = get_tracer()
    ids = []
    period = 1.0 / rate
    next_at = time.monotonic()
    print("ready", flush=True)
    for i in range(n):
        kind = kinds[i % 3]
        base = bases[kind]
        # distinct content on every span (the content cache cannot help), 128-256 KiB
        field = base[:24] + f"{i:08d}" + base[32:rng.randrange(128 * 1024, size)]
        with rollout_trace_attr(step=i // 64, sample_index=i % 64, rollout_n=0, name="traj"):
            with tracer.start_as_current_span(f"turn.{kind}",
                                              attributes={"input.value": field}) as span:
                pass
        ids.append(f"{span.get_span_context().span_id:016x}")
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    recorded = time.monotonic()
    ok = RolloutTraceConfig.shutdown()  # the default bound
    shutdown_s = time.monotonic() - recorded
    with open(out, "w") as handle:
        handle.write("\\n".join(ids))
    print(json.dumps({"ok": ok, "shutdown_s": shutdown_s, **RolloutTraceConfig.stats()}),
          flush=True)
""")


#: the next process: traces nothing itself, delivers the log the first left, and stops when the
#: test has seen every span arrive (the file ``done`` exists) or after 60 s
DRAIN = textwrap.dedent("""
    import json, os, sys, time
    from otel_verl import RolloutTraceConfig
    trace_dir, endpoint, protocol, done = sys.argv[1:5]
    RolloutTraceConfig.init("faults", "payload", "otlp", trace_dir=trace_dir,
                            otlp_endpoint=endpoint, otlp_protocol=protocol, export_timeout_s=2.0)
    deadline = time.monotonic() + 60
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = RolloutTraceConfig.stats()
    RolloutTraceConfig.shutdown(5.0)
    print(json.dumps(stats), flush=True)
""")


def _last_json(output: str) -> dict:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(output[-3000:])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.parametrize("outage", ["hang", "stall"])
def test_token_like_payloads_lose_nothing_through_an_outage(outage, tmp_path, figure):
    trace_dir = tmp_path / "traces"
    ids_file = tmp_path / "ids"
    start = time.monotonic()
    with FaultyReceiver(PROTOCOL) as receiver:
        receiver.set_mode("hang")  # accepts the connection and the request, never answers
        child = subprocess.Popen(
            [sys.executable, "-c", RECORD, str(trace_dir), receiver.endpoint, PROTOCOL,
             str(SPANS), str(RATE), str(ids_file)],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        healed = None
        if outage == "stall":  # the backend answers again STALL_S after the first span
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            healed = threading.Timer(STALL_S, receiver.set_mode, ("ok",))
            healed.start()
        try:
            output = child.communicate(timeout=120)[0]
        finally:
            if healed is not None:
                healed.cancel()
            if child.poll() is None:
                child.kill()
        assert child.returncode == 0, output[-3000:]
        first = _last_json(output)
        first_s = time.monotonic() - start
        delivered_first = receiver.ids()
        receiver.set_mode("ok")

        # the next process on the same trace dir delivers what the first left in the log
        ids = set(ids_file.read_text().split())
        done_flag = tmp_path / "done"
        log = (tmp_path / "drain.log").open("w+")  # a file: a full pipe cannot stall the child
        drain = subprocess.Popen(
            [sys.executable, "-c", DRAIN, str(trace_dir), receiver.endpoint, PROTOCOL,
             str(done_flag)], env=_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not ids <= receiver.ids() and time.monotonic() < deadline and drain.poll() is None:
            time.sleep(0.2)
        done_flag.touch()
        try:
            drain.wait(timeout=30)
        finally:
            if drain.poll() is None:
                drain.kill()
            log.seek(0)
            out = log.read()
            log.close()
        assert drain.returncode == 0, out[-3000:]
        second = _last_json(out)
        got = receiver.ids()
        duplicates = sum(n - 1 for span_id, n in receiver.received.items() if span_id in ids)
    lost = len(ids - got)
    figure(fault=f"otlp {outage}: {SPANS} spans x 128-256 KiB base64/hex/repeated at "
                 f"{RATE:.0f}/s", recorded=len(ids), received=len(ids & got), lost=lost,
           allowed=0, duplicates=duplicates, seconds=round(time.monotonic() - start, 1),
           note=f"first process: {len(ids & delivered_first)} delivered, "
                f"{first.get('kept_in_log_at_shutdown', 0)} handed to the log at shutdown, "
                f"dropped_queue_full={first.get('dropped_queue_full', 0)}, "
                f"abandoned_at_shutdown={first.get('abandoned_at_shutdown', 0)}, "
                f"shutdown {first['shutdown_s']:.1f} s ({first_s:.0f} s in all); next: "
                f"recovered={second.get('recovered', 0)}")
    assert len(ids) == SPANS
    assert first.get("dropped_queue_full", 0) == 0, first
    assert first.get("abandoned_at_shutdown", 0) == 0, first
    assert lost == 0, (first, second)
