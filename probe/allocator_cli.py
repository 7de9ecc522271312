"""Command line for the allocator simulation: replay a trace file, print the figures as JSON.

    python -m probe.allocator_cli TRACE [--expandable-segments] [--max-split-size-mb N]
        [--capacity-gib G] [--device-memory-gib G] [--large-segment-size-mb N]
        [--roundup-power2-divisions N] [--keep-going]

TRACE: JSON Lines, a JSON array or `alloc ID BYTES` / `free ID` lines (probe.allocator_events).
Exit code 2 with the offending field named on bad input; 0 otherwise (an OOM in the replay is a
result, reported as `oom_at_event`). Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import sys

from probe.allocator import AllocatorConfig, GiB, MiB, replay
from probe.allocator_events import load_trace

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m probe.allocator_cli",
        description="Replay an allocation trace through a model of the CUDA caching allocator.",
    )
    ap.add_argument("trace")
    ap.add_argument("--expandable-segments", action="store_true")
    ap.add_argument("--max-split-size-mb", type=int, default=None)
    ap.add_argument("--capacity-gib", type=float, default=None)
    ap.add_argument("--device-memory-gib", type=float, default=80.0)
    ap.add_argument("--large-segment-size-mb", type=int, default=20)
    ap.add_argument("--roundup-power2-divisions", type=int, default=0)
    ap.add_argument("--keep-going", action="store_true", help="skip OOM requests, do not stop")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = AllocatorConfig(
            expandable_segments=args.expandable_segments,
            max_split_size=None if args.max_split_size_mb is None else args.max_split_size_mb * MiB,
            capacity=None if args.capacity_gib is None else int(args.capacity_gib * GiB),
            device_memory=int(args.device_memory_gib * GiB),
            large_segment_size=args.large_segment_size_mb * MiB,
            roundup_power2_divisions=args.roundup_power2_divisions,
        )
        events = load_trace(args.trace)
        result = replay(events, config, stop_on_oom=not args.keep_going)
    except ValueError as exc:  # TraceError and AllocatorConfig name the field in the message
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: trace: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
