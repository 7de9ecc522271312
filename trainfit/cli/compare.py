"""`trainfit compare memtest.json`: the estimate next to memory measured by the probe."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainfit.cli.common import EXIT_OK, add_command, gib_text, read_memtest, write_json


def _gib_or_na(value: int | None) -> str:
    return "n/a" if value is None else gib_text(value)


def cmd_compare(args: argparse.Namespace) -> int:
    from estimator.document import compare_memtest

    result = compare_memtest(read_memtest(args.memtest, "memtest"), args.profile)
    if args.format == "json":
        write_json(result)
        return EXIT_OK
    sep = "|" if args.format == "markdown" else " "
    header = ["seq", "status", "measured GiB", "estimated GiB", "error GiB", "error %"]
    lines = [sep.join(header)]
    for r in result["rows"]:
        pct = "n/a" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        cells = [str(r["seq_len"]), str(r["status"]), _gib_or_na(r["measured_peak_bytes"])]
        cells += [gib_text(r["estimated_peak_bytes"]), _gib_or_na(r["error_bytes"]), pct]
        lines.append(sep.join(cells))
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def register(sub: Any) -> None:
    cmp_ = add_command(
        sub,
        "compare",
        "estimate vs a measured memtest_*.json",
        "trainfit compare memtest_h200.json --format markdown",
    )
    cmp_.add_argument("memtest", help="a trainfit.memtest/1 file written by trainfit-probe")
    cmp_.add_argument("--profile", default="default", help="assumption profile")
    cmp_.add_argument(
        "--format", default="table", choices=["table", "json", "markdown"], help="output"
    )
    cmp_.set_defaults(func=cmd_compare)
