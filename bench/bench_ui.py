"""The viewer at scale: the lake's compaction and open, and page latencies on a generated store.

A store of ``--trajectories`` (default 100,000) GRPO-style trajectories is generated in the local
store's format: 12 spans each (trajectory, agent run, 2 x generate + GenAI chat + the engine's
``llm_request`` in a second file as the demo's receiver writes it, 2 x tool-call parser, a tool
call, the reward), ~1.2M spans, realistic payloads (messages, token ids). The template trajectory
is recorded through otel_verl's own API and encoder; copies get new ids, identities, rewards,
token counts and times.

Measured (one run, side by side; the viewer reads through the lake only, the lake extra):
- the floor: ``orjson`` merely parsing every line of the store;
- compaction (what ``otel-verl ui`` does in the background): spans/s, against that floor, and
  the lake's size against the store's; then opening the lake over the segments plus 1,000 new
  trajectories appended raw (a live run), and over the raw files alone (nothing compacted yet);
- HTTP latency (median of 5, the real server on 127.0.0.1) of: the overview, the first table
  page, a filtered + sorted page, a free-text search, one trajectory page, a GRPO group, a prompt
  through training; over the compacted lake and over the raw files, interleaved, every answer
  compared between the two;
- baseline: what the terminal CLI did before the lake (``read_spans`` + ``group_trajectories``
  over the whole store), measured on a 10,000-trajectory slice and scaled per trajectory.
(The SQLite index it used to be compared with is gone: issue 19.)

Run: python bench/bench_ui.py [--trajectories N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_verl
from otel_verl import rollout_trace_attr, rollout_trace_op, semconv
from otel_verl.exporters._file_exporter import encode_request
from otel_verl.store import group_trajectories, list_files, read_spans
from otel_verl.store._compact import compact
from otel_verl.testing import capture_spans
from otel_verl.ui._lake import LakeSource
from otel_verl.ui.server import UIServer

STEP, SAMPLE, ROLLOUT = 987654321, 987654322, 987654323
REWARD, TOKENS = 0.123456789, 876543
BASE_S = 1_700_000_000
PROMPTS, N = 64, 8  # per step: 64 prompts x 8 rollouts = 512 trajectories


def _template() -> tuple[list[str], list[str], str, str]:
    """One trajectory as span JSON strings with markers (rollout spans, engine spans) and the two
    resources' JSON."""
    engine_memory = InMemorySpanExporter()
    engine = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: "vllm"}))
    engine.add_span_processor(SimpleSpanProcessor(engine_memory))
    engine_tracer = engine.get_tracer("vllm")
    messages = [{"role": "user", "content": "What is 17 * 23? Use the calculator."}]

    @rollout_trace_op
    def generate(prompt_ids: list[int], turn: int) -> dict[str, Any]:
        tracer = otel_verl.get_tracer()
        with tracer.start_as_current_span("chat tiny-qwen2", kind=trace.SpanKind.CLIENT,
                                          attributes={
                                              semconv.GEN_AI_OPERATION_NAME: "chat",
                                              semconv.OPENINFERENCE_SPAN_KIND: "LLM",
                                              semconv.GEN_AI_REQUEST_MODEL: "tiny-qwen2",
                                              semconv.GEN_AI_USAGE_INPUT_TOKENS: TOKENS,
                                              semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 40 + turn}):
            with engine_tracer.start_as_current_span("llm_request",
                                                     kind=trace.SpanKind.SERVER):
                pass
        return {"token_ids": list(range(100, 160)), "finish_reason": "stop"}

    @rollout_trace_op
    def parse(text: str) -> list[Any]:
        return [text, []]

    @rollout_trace_op(kind=semconv.SpanKindName.TOOL)
    def execute(call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
        trace.get_current_span().set_attributes({
            semconv.GEN_AI_OPERATION_NAME: "execute_tool", semconv.GEN_AI_TOOL_NAME: "calculator",
            semconv.GEN_AI_TOOL_CALL_ARGUMENTS: json.dumps(arguments),
            semconv.GEN_AI_TOOL_CALL_RESULT: "391"})
        return {"text": "391", "ok": True}

    @rollout_trace_op(kind=semconv.SpanKindName.EVALUATOR)
    def compute_score(solution: str, ground_truth: str) -> float:
        otel_verl.record_reward(REWARD, name="gsm8k", label="correct")
        return REWARD

    @rollout_trace_op
    def run(sampling_params: dict[str, Any], raw_prompt: list[Any]) -> dict[str, Any]:
        ids = list(range(1000, 1180))
        generate(ids, 0)
        parse('<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}')
        execute("call_0_0", {"expression": "17*23"})
        generate(ids + list(range(200, 260)), 1)
        parse("The answer is 391.")
        compute_score("The answer is 391.", "391")
        otel_verl.set_trajectory_attribute(semconv.ROLLOUT_NUM_TURNS, 4)
        convo = raw_prompt + [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0_0",
             "function": {"name": "calculator", "arguments": {"expression": "17*23"}}}]},
            {"role": "tool", "tool_call_id": "call_0_0", "content": "391"},
            {"role": "assistant", "content": "The answer is 391."}]
        return {"prompt_ids": ids, "response_ids": list(range(300, 420)),
                "extra_fields": {"messages": convo}}

    with capture_spans("bench", "bench-exp") as memory:
        with rollout_trace_attr(step=STEP, sample_index=SAMPLE, rollout_n=ROLLOUT,
                                name="agent_loop"):
            run({"temperature": 1.0}, messages)
        spans = memory.get_finished_spans()
    rollout = encode_request(spans)["resourceSpans"][0]
    engine_rs = encode_request(engine_memory.get_finished_spans())["resourceSpans"][0]
    # every time in the template's first second (BASE_S), in order, so a copy shifts by prefix
    all_spans = rollout["scopeSpans"][0]["spans"] + engine_rs["scopeSpans"][0]["spans"]
    origin = min(int(s["startTimeUnixNano"]) for s in all_spans)
    for s in all_spans:
        for key in ("startTimeUnixNano", "endTimeUnixNano"):
            s[key] = str(BASE_S * 10**9 + (int(s[key]) - origin) % 10**9)
        for event in s.get("events", ()):
            event["timeUnixNano"] = str(BASE_S * 10**9 + (int(event["timeUnixNano"]) - origin)
                                        % 10**9)
    dump = lambda v: json.dumps(v, separators=(",", ":"))  # noqa: E731
    return ([dump(s) for s in rollout["scopeSpans"][0]["spans"]],
            [dump(s) for s in engine_rs["scopeSpans"][0]["spans"]],
            dump({"resource": rollout["resource"], "scope": rollout["scopeSpans"][0]["scope"]}),
            dump({"resource": engine_rs["resource"], "scope": engine_rs["scopeSpans"][0]["scope"]}))


def _ids(spans: list[str]) -> tuple[str, list[str]]:
    trace_id = json.loads(spans[0])["traceId"]
    return trace_id, [json.loads(s)["spanId"] for s in spans]


def generate_store(directory: str, trajectories: int, start: int = 0, seed: int = 0) -> int:
    """Write ``trajectories`` copies of the template; returns the number of spans written."""
    rollout_spans, engine_spans, rollout_head, engine_head = _template()
    trace_id, span_ids = _ids(rollout_spans + engine_spans)
    rng = random.Random(seed + start)
    os.makedirs(directory, exist_ok=True)
    suffix = f"{start:08d}"
    written = 0

    def line(head: str, spans: list[str]) -> str:
        h = json.loads(head)
        return ('{"resourceSpans":[{"resource":' + json.dumps(h["resource"])
                + ',"scopeSpans":[{"scope":' + json.dumps(h["scope"]) + ',"spans":['
                + ",".join(spans) + "]}]}]}\n")

    with open(os.path.join(directory, f"otel_verl-bench-{suffix}.jsonl"), "w") as out, \
            open(os.path.join(directory, f"otel_verl-engine-bench-{suffix}.jsonl"), "w") as eng:
        batch: list[str] = []
        engine_batch: list[str] = []
        for i in range(start, start + trajectories):
            step, rest = divmod(i, PROMPTS * N)
            sample, rollout = divmod(rest, N)
            skill = min(0.9, 0.2 + step * 0.01 + (sample % 7) * 0.05)
            reward = 1.0 if rng.random() < skill else 0.0
            replace = [(trace_id, f"{i + 1:032x}")]
            replace += [(sid, f"{i + 1:08x}{k + 1:08x}") for k, sid in enumerate(span_ids)]
            replace += [(f'"{BASE_S}', f'"{BASE_S + i}'),
                        (f'"intValue":"{STEP}"', f'"intValue":"{step + 1}"'),
                        (f'"intValue":"{SAMPLE}"', f'"intValue":"{sample}"'),
                        (f'"intValue":"{ROLLOUT}"', f'"intValue":"{rollout}"'),
                        (f'"intValue":"{TOKENS}"', f'"intValue":"{rng.randint(150, 400)}"'),
                        (str(REWARD), str(reward))]
            for group, target in ((rollout_spans, batch), (engine_spans, engine_batch)):
                for span in group:
                    for old, new in replace:
                        span = span.replace(old, new)
                    target.append(span)
            if len(batch) >= 512:
                out.write(line(rollout_head, batch))
                written += len(batch)
                batch = []
            if len(engine_batch) >= 512:
                eng.write(line(engine_head, engine_batch))
                written += len(engine_batch)
                engine_batch = []
        for head, rest_spans, handle in ((rollout_head, batch, out),
                                         (engine_head, engine_batch, eng)):
            if rest_spans:
                handle.write(line(head, rest_spans))
                written += len(rest_spans)
    return written


def _get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body = response.read()
    return time.perf_counter() - started, body


def _median_ms(url: str, rounds: int = 5) -> tuple[float, bytes]:
    times, body = [], b""
    for _ in range(rounds):
        seconds, body = _get(url)
        times.append(seconds)
    return statistics.median(times) * 1e3, body


def _files(directory: str) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(directory) for f in names]


def _orjson_parse(store: str) -> float:
    """Seconds for orjson to parse every line of the store's files (the floor)."""
    import orjson

    started = time.perf_counter()
    for path in list_files(store):
        with open(path, "rb") as handle:
            for line in handle:
                if line.strip():
                    orjson.loads(line)
    return time.perf_counter() - started


def _comparable(answer: Any) -> Any:
    """An answer with the keys every step has (a step only a sampling report names has fewer),
    floats to 9 digits (sums may add in another order)."""
    if isinstance(answer, dict) and "steps" in answer:
        keys = set.intersection(*(set(s) for s in answer["steps"])) if answer["steps"] else set()
        return {"steps": [{k: (round(v, 9) if isinstance(v, float) else v)
                           for k, v in s.items() if k in keys and k not in (
                               "traced", "estimated", "reward_mean_unweighted", "by_reason",
                               "flags")}
                          for s in answer["steps"]], "flat": answer["flat"]}
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--keep", help="generate into this directory and keep it (a store already "
                                       "there is reused)")
    args = parser.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="bench_ui_")
    store = os.path.join(root, "store")
    try:
        started = time.perf_counter()
        if args.keep and os.path.isdir(store) and os.listdir(store):
            spans = 12 * args.trajectories
            print(f"reusing the store generated earlier in {store}")
            for extra in [f for f in os.listdir(store)
                          if f.endswith(f"{args.trajectories:08d}.jsonl")]:
                os.remove(os.path.join(store, extra))  # an earlier run's appended files
        else:
            spans = generate_store(store, args.trajectories)
        size = sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store))
        print(f"store: {args.trajectories} trajectories, {spans} spans, {size / 1e6:.0f} MB "
              f"({time.perf_counter() - started:.0f}s)", flush=True)
        parse = _orjson_parse(store)
        print(f"floor, orjson parsing every line: {parse:.1f}s = {spans / parse:,.0f} spans/s",
              flush=True)
        raw_store = os.path.join(root, "raw_store")  # the same files, never compacted
        shutil.rmtree(raw_store, ignore_errors=True)
        shutil.copytree(store, raw_store, ignore=shutil.ignore_patterns(".otel_verl_*"))
        lake_store = os.path.join(root, "lake_store")  # the same files, compacted
        shutil.rmtree(lake_store, ignore_errors=True)
        shutil.copytree(store, lake_store, ignore=shutil.ignore_patterns(".otel_verl_*"))
        done = compact(lake_store, live_bytes=0)
        lake_mb = sum(os.path.getsize(p) for p in _files(os.path.join(lake_store,
                                                                       ".otel_verl_lake"))) / 1e6
        print(f"lake compaction: {done.seconds:.1f}s = {done.spans / done.seconds:,.0f} spans/s "
              f"({done.seconds / parse:.1f}x the parse; {done.segments} segments; lake "
              f"{lake_mb:.0f} MB = {lake_mb / (size / 1e6):.3f}x the store)")
        # a live run: 1,000 more trajectories, raw; the same files in both (a template is
        # recorded per call, with its own durations)
        before = set(os.listdir(raw_store))
        generate_store(raw_store, 1000, start=args.trajectories)
        for name in sorted(set(os.listdir(raw_store)) - before):
            shutil.copy(os.path.join(raw_store, name), os.path.join(lake_store, name))
        sources: dict[str, Any] = {}
        for name, where in (("lake", lake_store), ("raw", raw_store)):
            started = time.perf_counter()
            sources[name] = LakeSource(where, compact=False)
            print(f"lake open, {'segments + the raw +1000 file' if name == 'lake' else 'every file raw'}"
                  f": {time.perf_counter() - started:.2f}s "
                  f"({sources[name].problems()['trajectories']} trajectories)", flush=True)
        bases = {}
        servers = []
        for name, source in sources.items():
            server = UIServer(source, port=0, poll_s=3600)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
            bases[name] = server.url + "api/"
        steps = args.trajectories // (PROMPTS * N)
        mid = max(1, steps // 2)
        _, body = _get(bases["lake"] + f"trajectories?step={mid}&sample_index=3")
        key = json.loads(body)["rows"][0]["key"]
        routes = (
            ("overview (all steps)", "overview"),
            ("table, first page", "trajectories"),
            ("table, step filter + sort by reward", f"trajectories?step={mid}&order=reward&desc=1"),
            ("table, free text search", "trajectories?text=17*23&page=3"),
            ("table, errors only", "trajectories?errors=1"),
            ("trajectory page", f"trajectory?key={key}"),
            ("GRPO group (8 rollouts)", f"group?step={mid}&sample_index=3&validate=0"),
            ("prompt through training", "prompt?sample_index=3&validate=0"),
        )
        rows: list[tuple[str, dict[str, float], int]] = []
        for label, route in routes:
            times: dict[str, list[float]] = {name: [] for name in bases}
            answers: dict[str, Any] = {}
            for _ in range(5):  # interleaved, so the machine's load falls on both alike
                for name, base in bases.items():
                    seconds, body = _get(base + route)
                    times[name].append(seconds)
                    answers[name] = json.loads(body)
            # every route: the same answer compacted and raw
            same = _comparable(answers["raw"]) == _comparable(answers["lake"])
            label += "" if same else " (answers differ!)"
            rows.append((label, {n: statistics.median(t) * 1e3 for n, t in times.items()},
                         len(body)))
        for server in servers:
            server.shutdown()
        names = list(bases)
        print(f"{'HTTP request (median of 5, interleaved)':<46}"
              + "".join(f"{n + ' ms':>11}" for n in names) + f"{'raw/lake':>12}")
        for label, ms, _ in rows:
            print(f"{label:<46}" + "".join(f"{ms[n]:11.1f}" for n in names)
                  + f"{ms['raw'] / ms['lake']:12.2f}")
        for source in sources.values():
            source.close()

        # baseline: the CLI's whole-store read, on a 10,000-trajectory slice of the same store
        sample = min(10_000, args.trajectories)
        slice_dir = os.path.join(root, "slice")
        generate_store(slice_dir, sample)
        started = time.perf_counter()
        grouped = group_trajectories(read_spans(slice_dir, warn=False))
        full = time.perf_counter() - started
        per_100k = full * 100_000 / sample
        overview_ms = rows[0][1]["lake"]
        print(f"baseline, read_spans + group_trajectories ({sample} trajectories, "
              f"{len(grouped)} grouped): {full:.1f}s -> ~{per_100k:.0f}s per 100k; "
              f"the lake's overview is {per_100k * 1e3 / overview_ms:,.0f}x faster than "
              "re-reading")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
