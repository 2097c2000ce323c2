"""``otel-weave-replay DIR`` / ``python -m otel_weave_exporter [replay] DIR``: resend spooled
calls."""

from __future__ import annotations

import argparse
import logging
import sys

from otel_weave_exporter._replay import replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="otel-weave-replay", description="Send calls spooled by otel-weave-exporter to Weave."
    )
    parser.add_argument("directory", help="the exporter's spool_dir")
    parser.add_argument("--base-url", default=None, help="trace server (default: as the exporter)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per project (60)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["replay"]:  # `python -m otel_weave_exporter replay DIR`
        argv = argv[1:]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        counts = replay(args.directory, base_url=args.base_url, timeout_s=args.timeout)
    except ValueError as exc:
        print(f"otel-weave-replay: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    return 0 if counts["undelivered"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
