"""Redaction speed on token-like content, before and after, measured side by side in one run.

1. MB/s of the span-end text pass (``_scrub``, the cache bypassed) on 1 MiB of prose, base64
   (multimodal prompts, images in tool results), hex and one repeated character, for the
   baseline implementation and the current one, and their ratio. The baseline is the module as it
   was at ``--baseline`` (a commit; default: the last one before the linear-time rewrite), read
   with ``git show`` and loaded as a temporary module.
2. The rollout thread's stall: a thread doing 1 ms sleeps (what an event loop does between
   awaits) while another scrubs base64 prompts (256 KiB each, as the export thread does); the
   p50/p99/max of the extra latency per sleep, for no scrubbing, a pure-Python busy thread (the
   floor CPython's 5 ms switch interval sets for any busy thread), the baseline and the current
   pass.
3. The same 256 KiB prompt seen again (every turn of a trajectory): ``scrub`` through the cache.

Run: ``python bench/bench_scrub.py`` (any venv with the core, from the repository).
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_verl.exporters import _scrub as current  # noqa: E402

#: the last commit before the linear-time rewrite of otel_verl/exporters/_scrub.py
BASELINE = "d3c4e26"
SIZE = 1 << 20


def load_baseline(commit: str) -> ModuleType:
    source = subprocess.run(["git", "show", f"{commit}:otel_verl/exporters/_scrub.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "scrub_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("scrub_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def contents(size: int) -> dict[str, str]:
    rng = random.Random(5)
    words = ("the model answered that the tool result was fair given the plan and the reward "
             "of the step; see https://example.com/docs for details: ok = true").split()
    prose = " ".join(rng.choice(words) for _ in range(size // 4))[:size]
    return {
        "prose": prose,
        "base64": base64.b64encode(rng.randbytes(size * 3 // 4)).decode()[:size],
        "hex": rng.randbytes(size // 2).hex(),
        "repeated": "x" * size,
    }


def seconds_per_call(fn: Callable[[], Any], budget_s: float) -> float:
    """The best of a few calls (at least 2, about ``budget_s`` in all)."""
    times = []
    start = time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - start < budget_s and len(times) < 20):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def bench_rates(baseline: ModuleType, budget_s: float) -> None:
    print(f"redaction MB/s on {SIZE >> 20} MiB (1 MB = 1e6 characters; the cache bypassed)")
    print(f"  {'content':10s} {'before':>9s} {'after':>9s} {'ratio':>8s}")
    for name, text in contents(SIZE).items():
        rates = []
        for module in (baseline, current):
            seconds = seconds_per_call(lambda m=module, t=text: m._scrub(t, ()), budget_s)
            rates.append(len(text) / seconds / 1e6)
        before, after = rates
        print(f"  {name:10s} {before:9.1f} {after:9.1f} {after / before:7.1f}x")


def stall(work: Callable[[], None] | None, duration_s: float) -> list[float]:
    """Extra latency (s) of 1 ms sleeps on a 'rollout' thread while ``work`` loops on another."""
    stop = threading.Event()
    extra: list[float] = []

    def rollout() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            time.sleep(0.001)
            extra.append(max(0.0, time.perf_counter() - began - 0.001))

    def worker() -> None:
        while work is not None and not stop.is_set():
            work()

    threads = [threading.Thread(target=rollout), threading.Thread(target=worker)]
    for thread in threads:
        thread.start()
    time.sleep(duration_s)
    stop.set()
    for thread in threads:
        thread.join()
    return extra


def busy_python() -> None:
    total = 0
    for i in range(20_000):
        total += i


def bench_stall(baseline: ModuleType, duration_s: float) -> None:
    rng = random.Random(9)
    prompts = [base64.b64encode(rng.randbytes(192 * 1024)).decode() for _ in range(4)]
    print(f"rollout-thread stall while another thread scrubs 256 KiB base64 prompts "
          f"({duration_s:.0f} s each; switch interval {sys.getswitchinterval() * 1e3:.0f} ms)")
    print(f"  {'':24s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'sleeps':>7s}")
    cases: list[tuple[str, Callable[[], None] | None]] = [
        ("nothing else running", None),
        ("pure-Python busy thread", busy_python),
        ("before (baseline)", lambda: [baseline._scrub(p, ()) for p in prompts] and None),
        ("after (current)", lambda: [current._scrub(p, ()) for p in prompts] and None),
    ]
    for label, work in cases:
        extra = sorted(stall(work, duration_s))
        p99 = extra[min(len(extra) - 1, int(len(extra) * 0.99))]
        print(f"  {label:24s} {statistics.median(extra) * 1e3:8.2f} {p99 * 1e3:8.2f} "
              f"{extra[-1] * 1e3:8.2f} {len(extra):7d}")


def bench_cache(budget_s: float) -> None:
    rng = random.Random(3)
    prompt = "data:image/png;base64," + base64.b64encode(rng.randbytes(192 * 1024)).decode()
    current._CACHE.clear()
    cold = seconds_per_call(lambda: current._scrub(prompt, ()), budget_s)
    current.scrub(prompt)
    warm = seconds_per_call(lambda: current.scrub("".join([prompt])), budget_s)  # a new object
    print(f"the same 256 KiB prompt again: {cold * 1e3:.2f} ms scanned, {warm * 1e3:.3f} ms "
          f"through the cache ({cold / warm:.0f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="commit of the 'before' module")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    bench_rates(baseline, args.seconds / 2)
    bench_stall(baseline, args.seconds)
    bench_cache(args.seconds / 4)


if __name__ == "__main__":
    main()
