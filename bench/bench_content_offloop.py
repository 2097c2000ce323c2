"""What the content thread takes off the event loop, measured against the same work done on the
loop, side by side in one run (``bench_rollout_stub``'s trajectories, interleaved rounds).

Modes (``off`` untraced, as a baseline):
- on:     payloads on, as shipped: turn 1's ``gen_ai.input.messages`` head is rendered with the
          conversation's hash off the loop, a gone chain's long copy is emptied off the loop
- inline: the same, with both pieces done on the loop again (the head rendered when the call
          starts, a gone chain's copy emptied where the chain goes), as before they moved
- inline_head, inline_clear (``--each``): only the one piece on the loop

Printed per mode: the median throughput against ``off`` and against ``inline`` (per-round
spread), and the loop-thread CPU per trajectory (``time.thread_time``) against ``inline``,
paired round by round: load cancels out of the pairs.

Run: ``python bench/bench_content_offloop.py [--rounds 6] [--context-tokens 32768]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_rollout_stub as stub  # noqa: E402

from otel_verl import _capture, _content  # noqa: E402


@contextlib.contextmanager
def _inline(head: bool = True, clear: bool = True) -> Iterator[None]:
    """Both pieces back on the loop: the head rendered at the call's start, copies emptied by
    whoever drops the chain."""
    render, clear_at = _capture.input_messages_attrs, _content._CLEAR_OFF_LOOP

    def on_loop(messages: Any, convert: Any) -> dict[str, Any]:
        attrs = render(messages, convert)
        traj = _capture.TRAJECTORY.get()
        for step in (traj.content.values() if traj is not None else ()):
            if type(step) is _content.PendingStep and step.after is not None:
                after, step.after = step.after, None
                step.after_value = after()
        return attrs

    import otel_verl.rollout.clients as clients
    bound = clients.input_messages_attrs
    if head:
        _capture.input_messages_attrs = on_loop
        clients.input_messages_attrs = on_loop
    if clear:
        _content._CLEAR_OFF_LOOP = 1 << 62
    try:
        yield
    finally:
        _capture.input_messages_attrs = render
        clients.input_messages_attrs = bound
        _content._CLEAR_OFF_LOOP = clear_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--context-tokens", type=int, default=32 * 1024)
    parser.add_argument("--each", action="store_true",
                        help="also each piece alone on the loop (inline_head, inline_clear)")
    args = parser.parse_args()
    modes = ["off", "on", "inline"] + (["inline_head", "inline_clear"] if args.each else [])
    for mode in modes[2:]:
        stub.MODES[mode] = {}
    results: dict[str, list[tuple[float, ...]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as trace_dir:
        stub._round("off", 4, 0, args.context_tokens, trace_dir)  # warm-up
        # and a traced one: the first traced round fills the pool of spare copies (what every
        # later round, of either mode, copies into)
        stub._round("on", args.trajectories, 0, args.context_tokens, trace_dir)
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                with _inline(mode != "inline_clear", mode != "inline_head") \
                        if mode.startswith("inline") else contextlib.nullcontext():
                    res = stub._round(mode, args.trajectories, r + 1, args.context_tokens,
                                      trace_dir)
                results[mode].append(res)
            print(f"round {r + 1}: " + " | ".join(
                f"{m}: {results[m][-1][0]:6.2f} traj/s, loop {results[m][-1][1] * 1e3:5.2f} ms"
                for m in modes), flush=True)

    def paired(mode: str, base: str, index: int, scale: float = 1.0) -> list[float]:
        return [(a[index] / b[index]) if index == 0 else (a[index] - b[index]) * scale
                for a, b in zip(results[mode], results[base], strict=True)]

    def spread(values: list[float], fmt: str) -> str:
        return (f"{format(statistics.median(values), fmt)} (rounds "
                f"{format(min(values), fmt)} to {format(max(values), fmt)})")

    print(f"\n{args.trajectories} trajectories, {args.context_tokens}-token contexts, "
          f"{args.rounds} rounds (medians of per-round pairs)")
    for mode in modes[1:]:
        print(f"{mode:>7}/off throughput {spread(paired(mode, 'off', 0), '.3f')}; loop CPU "
              f"added {spread(paired(mode, 'off', 1, 1e3), '.2f')} ms/traj")
    for mode in modes[3:]:
        print(f"{mode:>12}/inline throughput {spread(paired(mode, 'inline', 0), '.3f')}")
    print(f"     on/inline throughput {spread(paired('on', 'inline', 0), '.3f')}; loop CPU "
          f"{spread(paired('on', 'inline', 1, 1e3), '.3f')} ms/traj")


if __name__ == "__main__":
    main()
