"""Capture and redaction cost, measured side by side in one run.

1. Capture is O(cap): ``to_payload`` of a 128k-token list and of a 1M-key dict against a list and
   a dict whose JSON is about the cap (``max_field_bytes``, 64 KiB): the ratios should be ~1
   (target <= 1.5x). The encoder in use (orjson when installed, else json) is named; with
   ``--compare-encoders`` the stdlib encoder is measured in the same run for the same inputs.
2. Redaction cost: ``scrub`` (the span-end pass) in MB/s over three kinds of text (token ids,
   chat JSON, chat JSON full of secrets and separators) at 64 KiB, 1 MiB and 8 MiB (linear in
   bytes: the MB/s stays flat), and ``Scrubber(span)`` on a realistic 4-turn rollout's spans.

Medians of interleaved rounds. Run: ``python bench/bench_capture.py`` (any venv with the core).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from otel_verl import _payload
from otel_verl._payload import to_payload
from otel_verl.exporters._scrub import _CACHE, Scrubber, scrub

CAP = 64 * 1024


def _time(fn: Callable[[], Any], repeat: int) -> float:
    """Seconds per call: the best of ``repeat`` timed loops (each ~20 ms or 1 call)."""
    fn()
    loops = 1
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    if once < 0.02:
        loops = max(1, int(0.02 / max(once, 1e-7)))
    best = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        best.append((time.perf_counter() - start) / loops)
    return statistics.median(best)


def _inputs() -> dict[str, Any]:
    rng = random.Random(0)
    ids = [rng.randrange(100_000, 151_000) for _ in range(128 * 1024)]
    per_token = len(json.dumps(ids[:1000], separators=(",", ":"))) / 1000
    at_cap = ids[: int(CAP / per_token * 0.95)]
    big_dict = {f"k{i:07d}": i for i in range(1_000_000)}
    per_key = len(json.dumps(dict(list(big_dict.items())[:1000]), separators=(",", ":"))) / 1000
    dict_at_cap = dict(list(big_dict.items())[: int(CAP / per_key * 0.95)])
    return {"list_at_cap": at_cap, "list_128k": ids, "dict_at_cap": dict_at_cap,
            "dict_1m": big_dict}


def bench_capture(repeat: int, compare: bool) -> None:
    data = _inputs()
    gc.collect()
    gc.freeze()  # the inputs' millions of objects are not the collector's work during timing
    encoders = [("orjson" if _payload._orjson is not None else "json", _payload._orjson)]
    if compare and _payload._orjson is not None:
        encoders.append(("json", None))
    print(f"capture: to_payload(max_bytes={CAP}); {len(data['list_at_cap'])} tokens and "
          f"{len(data['dict_at_cap'])} keys are at the cap")
    saved = _payload._orjson
    try:
        for name, module in encoders:
            _payload._orjson = module
            times = {key: _time(lambda v=value: to_payload(v, max_bytes=CAP), repeat)
                     for key, value in data.items()}
            sizes = {key: len(to_payload(value, max_bytes=CAP).json) for key, value in data.items()}
            print(f"  encoder {name}:")
            for key in data:
                print(f"    {key:12s} {times[key] * 1e3:8.3f} ms   ({sizes[key]} bytes of JSON)")
            print(f"    ratio 128k-token list / list at the cap: "
                  f"{times['list_128k'] / times['list_at_cap']:.2f}x   (target <= 1.5x)")
            print(f"    ratio 1M-key dict / dict at the cap:     "
                  f"{times['dict_1m'] / times['dict_at_cap']:.2f}x   (target <= 1.5x)")
    finally:
        _payload._orjson = saved


def _texts(size: int) -> dict[str, str]:
    rng = random.Random(1)
    ids = json.dumps({"prompt_ids": [rng.randrange(151_000) for _ in range(size // 6)]})[:size]
    words = ("the model called the calculator tool and returned the final answer of the sum "
             "which is correct because twelve times seven is eighty four").split()
    chat = []
    total = 0
    while total < size:
        content = " ".join(rng.choice(words) for _ in range(60))
        chat.append({"role": rng.choice(["user", "assistant", "tool"]), "content": content})
        total += len(content) + 40
    chat_text = json.dumps({"messages": chat}, ensure_ascii=False)[:size]
    record = json.dumps({"api_key": "sk-proj-" + "a1" * 12, "password": "hunter2",
                         "url": "https://u:p@h/x", "note": "Bearer abcdef1234567890",
                         "max_tokens": 5, "time": "12:30:45", "x": "y=z"})
    noisy = record * (size // len(record) + 1)
    return {"token_ids": ids, "chat_json": chat_text, "secrets_dense": noisy[:size]}


def bench_scrub(repeat: int) -> None:
    print("redaction: scrub(text), MB/s (1 MB = 1e6 characters)")
    for size in (64 * 1024, 1024 * 1024, 8 * 1024 * 1024):
        texts = _texts(size)
        row = []
        for name, text in texts.items():
            # the cache would answer every call after the first: clear it, to measure the scan
            seconds = _time(lambda t=text: (_CACHE.clear(), scrub(t)), max(3, repeat // 2))
            row.append(f"{name} {len(text) / seconds / 1e6:7.1f}")
        print(f"  {size // 1024:6d} KiB: " + "   ".join(row))
    _bench_spans(repeat)


def _bench_spans(repeat: int) -> None:
    """Scrubber(span) on the spans of one traced 4-turn rollout with 32k-token contexts."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    rng = random.Random(2)
    prompt = [rng.randrange(151_000) for _ in range(32 * 1024)]
    for turn in range(4):
        attrs = {"input.value": to_payload({"prompt_ids": prompt, "sampling_params": {
            "temperature": 1.0, "max_tokens": 512}}, max_bytes=CAP).json,
            "output.value": to_payload({"token_ids": prompt[:300], "text": "the answer " * 80},
                                       max_bytes=CAP).json,
            "gen_ai.usage.input_tokens": 32768, "rollout.step": 1, "rollout.sample_index": turn}
        with tracer.start_as_current_span(f"generate {turn}", attributes=attrs):
            pass
    spans = exporter.get_finished_spans()
    scrubber = Scrubber()
    size = sum(len(v) for s in spans for v in s.attributes.values() if isinstance(v, str))
    seconds = _time(lambda: (_CACHE.clear(), [scrubber(s) for s in spans]), repeat)
    print(f"  Scrubber on a 4-turn 32k-context rollout's generate spans: {seconds * 1e3:.2f} ms "
          f"for {size / 1e3:.0f} kB of attributes ({size / seconds / 1e6:.0f} MB/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compare-encoders", action="store_true",
                        help="also measure the stdlib json encoder when orjson is installed")
    args = parser.parse_args()
    bench_capture(args.repeat, args.compare_encoders)
    bench_scrub(args.repeat)


if __name__ == "__main__":
    main()
