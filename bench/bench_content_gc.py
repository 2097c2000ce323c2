"""What the cyclic GC scans at long contexts, tracing off vs on, and what a GC-free copy of a
context would cost (issue 18).

Two parts, both at ``--context-tokens`` (default 131072):

1. **Snapshots** (micro, one thread): the loop's ways to keep a copy of a prompt that the caller
   may edit in place, on a list of fresh int objects (as a tokenizer makes them): the chain's
   list copy (``_content._own_copy``), a tuple, ``array('q')``, the canonical bytes
   (``token_bytes``: orjson), marshal; the later turns' prefix check against each (a list
   compare of the same objects, or encoding the new prompt to compare bytes); and what one
   young collection spends per context-long list it finds (list: every collection that finds
   it young, then each middle and full one; tuple: the first one, which untracks it).

2. **Rollout census**: ``bench_rollout_stub``'s rollout (64 concurrent 4-turn trajectories, the
   engine answers after 500 ms), modes interleaved round by round. A ``gc.callbacks`` hook
   counts, per collection, the context-long lists (at least half the context) in the
   generations it collects, and at each young collection the GC-tracked objects waiting in
   generation 0 by type (what filled the collector's counter since the last one). Printed per
   mode: collections per round by generation, their ms, the context-long list scans per
   trajectory by generation and their ms each, and the tracked types that tracing adds (per
   trajectory, summed over the young collections, against ``off``).

Run: ``python bench/bench_content_gc.py [--context-tokens 131072] [--rounds 2] [--modes on]``
in a venv with the unit tier's requirements. The census's counting runs inside the collector's
callback (outside the ms it reports); throughput is not its figure (``bench_rollout_stub`` is).
"""

from __future__ import annotations

import argparse
import array
import collections
import gc
import marshal
import random
import statistics
import tempfile
import time
from typing import Any

import bench_rollout_stub as stub

from otel_verl import _content


def _best(fn: Any, repeat: int = 7) -> float:
    """Best-of wall seconds of ``fn()``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def snapshots(n: int) -> None:
    rng = random.Random(18)
    tokens = [rng.randrange(300, 150_000) for _ in range(n)]  # fresh int objects (> 256)
    held = _content._own_copy(tokens)
    enc = _content.token_bytes(tokens)
    assert enc is not None
    rows = [
        ("list copy (the chain's, _own_copy)", lambda: _content._own_copy(tokens)),
        ("tuple(ids)", lambda: tuple(tokens)),
        ("array('q', ids)", lambda: array.array("q", tokens)),
        ("token_bytes(ids) (orjson)", lambda: _content.token_bytes(tokens)),
        ("marshal.dumps(ids)", lambda: marshal.dumps(tokens)),
        ("later turn: list == list (same objects)", lambda: held == tokens),
        ("later turn: encode + bytes compare", lambda: _content.token_bytes(tokens) == enc),
    ]
    print(f"snapshots of a {n}-token prompt (best of 7, one thread):")
    for name, fn in rows:
        print(f"  {name:44s} {_best(fn) * 1e3:7.3f} ms")
    # one young collection's cost per context-long container it finds
    k = 16
    gc.collect()

    def young_with(make: Any) -> tuple[float, float]:
        gc.collect()
        kept = [make() for _ in range(k)]
        t0 = time.perf_counter()
        gc.collect(0)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        gc.collect(1)  # the middle collection that finds them next (tuples untracked by now)
        second = time.perf_counter() - t0
        del kept
        return first, second

    def best_of(make: Any) -> tuple[float, float]:
        tries = [young_with(make) for _ in range(3)]
        return min(t[0] for t in tries), min(t[1] for t in tries)

    base = best_of(lambda: None)
    for name, make in (("list", lambda: _content._own_copy(tokens)),
                       ("tuple", lambda: tuple(tokens))):
        first, second = best_of(make)
        print(f"  GC per {name:5s} found: young {(first - base[0]) / k * 1e3:6.3f} ms, "
              f"the middle one after {(second - base[1]) / k * 1e3:6.3f} ms")


class _Census:
    """Per collection: generation, ms, context-long lists in the generations collected; at
    young collections the tracked objects in generation 0 by type."""

    def __init__(self, big: int) -> None:
        self.big = big
        self.rows: list[tuple[int, float, int]] = []
        self.types: collections.Counter[str] = collections.Counter()
        self._t0 = 0.0
        self._bigs = 0

    def _count_big(self, generation: int) -> int:
        return sum(1 for o in gc.get_objects(generation)
                   if type(o) is list and len(o) >= self.big)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._bigs = sum(self._count_big(g) for g in range(generation + 1))
            if generation == 0:
                for o in gc.get_objects(0):
                    self.types[type(o).__name__] += 1
            self._t0 = time.perf_counter()
        else:
            self.rows.append((generation, time.perf_counter() - self._t0, self._bigs))


def census(modes: list[str], rounds: int, n: int, context: int) -> None:
    per: dict[str, list[_Census]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as trace_dir:
        stub._round("off", 4, 0, context, trace_dir)  # warm-up
        for r in range(rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                clock = _Census(context // 2)
                gc.callbacks.append(clock)
                try:
                    stub._round(mode, n, r + 1, context, trace_dir)
                finally:
                    gc.callbacks.remove(clock)
                per[mode].append(clock)
    print(f"\nrollout census: {n} trajectories x 4 turns, {context}-token contexts, {rounds} "
          "rounds (medians over rounds)")
    off_types: collections.Counter[str] = collections.Counter()
    for c in per["off"]:
        off_types.update(c.types)
    for mode in modes:
        clocks = per[mode]
        cells = []
        for g in (0, 1, 2):
            count = statistics.median(sum(1 for x in c.rows if x[0] == g) for c in clocks)
            ms = statistics.median(sum(x[1] for x in c.rows if x[0] == g) for c in clocks) * 1e3
            scans = statistics.median(sum(x[2] for x in c.rows if x[0] == g)
                                      for c in clocks) / n
            each = [sum(x[1] for x in c.rows if x[0] == g) / s * 1e3 for c in clocks
                    if (s := sum(x[2] for x in c.rows if x[0] == g))]
            cells.append(f"gen{g}: {count:g} coll {ms:6.1f} ms, {scans:.2f} long-list scans/traj"
                         + (f" ({statistics.median(each):.2f} ms each)" if each else ""))
        total = statistics.median(sum(x[1] for x in c.rows) for c in clocks) * 1e3 / n
        print(f"{mode:>5}: GC {total:.2f} ms/traj | " + " | ".join(cells))
    for mode in modes[1:]:
        mine: collections.Counter[str] = collections.Counter()
        for c in per[mode]:
            mine.update(c.types)
        added = {t: (mine[t] - off_types.get(t, 0)) / (n * rounds) for t in mine}
        top = sorted(added.items(), key=lambda kv: -kv[1])[:14]
        print(f"{mode:>5}: tracked objects in gen 0 at young collections, added per trajectory "
              "vs off: " + ", ".join(f"{t} {v:+.1f}" for t, v in top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context-tokens", type=int, default=128 * 1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--modes", default="on", help="comma-separated modes besides off")
    parser.add_argument("--no-census", action="store_true", help="the snapshot table only")
    args = parser.parse_args()
    snapshots(args.context_tokens)
    if not args.no_census:
        modes = ["off"] + [m for m in args.modes.split(",") if m and m != "off"]
        census(modes, args.rounds, args.trajectories, args.context_tokens)


if __name__ == "__main__":
    main()
