"""``otel-verl parity`` and ``otel-verl traces export`` (issue 22; docs/parity.md).

Wired into ``otel_verl.cli`` by ``add_parity_parser`` / ``add_export_parser``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from otel_verl.store import read_spans
from otel_verl.store._content import ContentIndex
from otel_verl.store._export import FORMATS, export_rows, write_dataset
from otel_verl.store._parity import check, load_consumed

__all__ = ["add_export_parser", "add_parity_parser"]


def _spans(directory: str) -> list[dict[str, Any]] | None:
    try:
        return list(read_spans(directory, warn=False))
    except FileNotFoundError:
        print(f"otel-verl: no traces at {directory}", file=sys.stderr)
        return None


def _cmd_parity(args: argparse.Namespace) -> int:
    spans = _spans(args.dir)
    if spans is None:
        return 1
    source = args.against or args.dir
    try:
        consumed = load_consumed(source)
    except (OSError, ImportError) as exc:
        print(f"otel-verl: cannot read what the trainer consumed from {source}: {exc}",
              file=sys.stderr)
        return 1
    reports = check(spans, ContentIndex.load(args.dir), consumed,
                    max_staleness=args.max_staleness)
    if args.step is not None:
        reports = [r for r in reports if r.traced.key[0] == args.step]
    if args.json:
        json.dump([r.as_dict() for r in reports], sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        for report in reports:
            print(f"{report.label()}  {'equal' if report.equal else 'DIFFERS'}")
            for difference in report.differences:
                print(f"    {difference.kind}: {difference.message}")
            for note in report.notes:
                print(f"    note: {note}")
        kinds = Counter(d.kind for r in reports for d in r.differences)
        equal = sum(1 for r in reports if r.equal)
        print(f"{equal} of {len(reports)} trajectories equal to what the trainer consumed"
              + (f"; differences: {', '.join(f'{k}={v}' for k, v in sorted(kinds.items()))}"
                 if kinds else "") + f" ({len(consumed)} consumed records from {source})")
    return 0 if all(r.equal for r in reports) else 3


def add_parity_parser(commands: Any, store_options: Callable[[argparse.ArgumentParser], None]
                      ) -> None:
    parser = commands.add_parser(
        "parity", help="compare traced trajectories with what the trainer consumed (token ids, "
        "mask, reward, turns, policy version; docs/parity.md); exit 3 when any differs")
    store_options(parser)
    parser.add_argument(
        "--against", metavar="FILE", default=None,
        help="a dataset file (JSONL or Parquet: prompt_ids, response_ids, response_mask, reward, "
             "...) or a trace dir; default: the verl integration's records under <dir>/parity/")
    parser.add_argument("--max-staleness", type=int, default=None,
                        help="also report trajectories sampled more weight updates behind")
    parser.add_argument("--step", type=int, help="only this step's trajectories")
    parser.set_defaults(handler=_cmd_parity)


def _cmd_export(args: argparse.Namespace) -> int:
    spans = _spans(args.dir)
    if spans is None:
        return 1
    rows = export_rows(spans, ContentIndex.load(args.dir), step=args.step,
                       sample_index=args.sample_index, rollout_n=args.rollout_n,
                       experiment=args.experiment, validate=args.validate,
                       min_reward=args.min_reward, max_reward=args.max_reward)
    try:
        n = write_dataset(rows, args.output, args.format)
    except ImportError as exc:
        print(f"otel-verl: Parquet needs pyarrow (pip install 'otel-verl[lake]'): {exc}",
              file=sys.stderr)
        return 1
    print(f"otel-verl: {n} trajectories written to {args.output}", file=sys.stderr)
    return 0


def add_export_parser(traces_commands: Any,
                      store_options: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = traces_commands.add_parser(
        "export", help="selected trajectories as a dataset file (chat messages, token ids, "
        "mask, reward, policy version): Parquet or JSONL for Hugging Face datasets")
    store_options(parser)
    parser.add_argument("-o", "--output", required=True, metavar="FILE")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="default: parquet for a .parquet file, else jsonl")
    parser.add_argument("--step", type=int)
    parser.add_argument("--sample-index", type=int)
    parser.add_argument("--rollout-n", type=int)
    parser.add_argument("--experiment")
    parser.add_argument("--validate", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--min-reward", type=float)
    parser.add_argument("--max-reward", type=float)
    parser.set_defaults(handler=_cmd_export)
