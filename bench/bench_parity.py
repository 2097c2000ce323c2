"""The cost of parity's hashing (issue 22), measured in one run, interleaved.

Per trajectory the verl integration does two things with what the trainer consumes:

- on the rollout's loop: ``record_consumed(output)`` queues a reference (``_parity`` writer);
- off the loop, in the writer's thread: ``summarize`` (the prompt's and the response's
  ``token_content_id``, the response cut into mask runs, an id each) and one JSON line.

Both are printed as time per trajectory and as a ratio to a baseline measured in the same rounds:
one traced op's span (``rollout_trace_op`` without payloads, inside a trajectory), what any traced
call costs the loop. A trajectory here is ``turns`` model turns of ``response`` tokens each with a
tool answer of 40 tokens between them, after a prompt of ``prompt`` tokens. The policy version
read at each LLM call's start (``_policy.start_attributes``) is timed too.

Run: ``python bench/bench_parity.py [--prompt 4096] [--response 512] [--turns 4]`` in a venv with
the unit tier's requirements.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import otel_verl
from otel_verl import RolloutTraceConfig, _policy, rollout_trace_attr
from otel_verl.integrations.verl import _parity as verl_parity
from otel_verl.store._parity import summarize


def _output(prompt: int, response: int, turns: int) -> Any:
    ids, mask = [], []
    for k in range(turns):
        ids += list(range(1000 + k, 1000 + k + response))
        mask += [1] * response
        if k < turns - 1:
            ids += list(range(50, 90))
            mask += [0] * 40
    return SimpleNamespace(prompt_ids=list(range(prompt)), response_ids=ids, response_mask=mask,
                           reward_score=1.0, num_turns=2 * turns,
                           extra_fields={"min_global_steps": 3, "max_global_steps": 3})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=200)
    args = parser.parse_args()
    out = _output(args.prompt, args.response, args.turns)
    tmp = tempfile.mkdtemp(prefix="bench_parity_")
    RolloutTraceConfig.init("bench", "parity", "file", trace_dir=tmp)

    @otel_verl.rollout_trace_op(capture_input=False, capture_output=False)
    def op() -> None:
        return None

    timings: dict[str, list[float]] = {"span": [], "queue": [], "summary": [], "version": []}
    _policy.set_policy_version(3)
    attrs: dict[str, Any] = {}
    for _ in range(args.rounds):
        with rollout_trace_attr(step=4, sample_index=0, rollout_n=0):
            t0 = time.perf_counter()
            for _ in range(args.per_round):
                op()
            timings["span"].append((time.perf_counter() - t0) / args.per_round)
            t0 = time.perf_counter()
            for _ in range(args.per_round):
                verl_parity.record_consumed(out)
            timings["queue"].append((time.perf_counter() - t0) / args.per_round)
            t0 = time.perf_counter()
            for _ in range(args.per_round):
                _policy.start_attributes(attrs)
            timings["version"].append((time.perf_counter() - t0) / args.per_round)
        assert verl_parity.flush_all(60)
        n = max(1, args.per_round // 10)
        t0 = time.perf_counter()
        for _ in range(n):
            summarize(out.prompt_ids, out.response_ids, out.response_mask, reward=1.0,
                      num_turns=8, min_version=3, max_version=3)
        timings["summary"].append((time.perf_counter() - t0) / n)
    _policy.set_policy_version(None)
    stats = verl_parity.stats()
    RolloutTraceConfig.shutdown(10.0)
    span = statistics.median(timings["span"])
    tokens = args.prompt + len(out.response_ids)
    print(f"trajectory: prompt {args.prompt} + response {len(out.response_ids)} tokens, "
          f"{args.turns} turns; {stats['parity_written']} records written, "
          f"{stats['parity_dropped']} dropped")
    print(f"baseline: one traced op span          {span * 1e6:8.2f} us")
    for key, label in (("version", "policy version at an LLM call start"),
                       ("queue", "record_consumed (on the loop)"),
                       ("summary", "summarize (writer thread, off the loop)")):
        value = statistics.median(timings[key])
        print(f"{label:<40} {value * 1e6:8.2f} us  = {value / span:6.2f}x a span")
    summary = statistics.median(timings["summary"])
    print(f"hashing throughput off the loop: {tokens / summary / 1e6:.1f} M tokens/s")
    print(f"files under {tmp}/{os.path.basename(verl_parity.parity.CONSUMED_DIR)}")


if __name__ == "__main__":
    sys.exit(main())
