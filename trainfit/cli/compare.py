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
    # a GPU memtest has the allocator's reserved peak and CUDA's free memory: show both
    on_gpu = any(r.get("measured_reserved_bytes") is not None for r in result["rows"])
    header = ["seq", "status", "measured GiB", "estimated GiB", "error GiB", "error %"]
    # a CPU or fake memtest run with --simulate-reserved: the simulated allocator's reserved
    simulated = any(r.get("simulated_reserved_bytes") is not None for r in result["rows"])
    if on_gpu:
        header += ["reserved GiB", "est. reserved GiB", "reserved error %", "outside GiB"]
    elif simulated:
        header += ["simulated reserved GiB", "est. reserved GiB", "reserved error %"]
    lines = [sep.join(header)]
    for r in result["rows"]:
        cells = [str(r["seq_len"]), str(r["status"]), _gib_or_na(r["measured_peak_bytes"])]
        cells += [gib_text(r["estimated_peak_bytes"]), _gib_or_na(r["error_bytes"])]
        cells.append(_pct_or_na(r["error_pct"]))
        if on_gpu:
            cells += [_gib_or_na(r["measured_reserved_bytes"])]
            cells += [gib_text(r["estimated_reserved_bytes"]), _pct_or_na(r["reserved_error_pct"])]
            cells.append(_gib_or_na(r["measured_outside_allocator_bytes"]))
        elif simulated:
            cells += [_gib_or_na(r["simulated_reserved_bytes"])]
            cells += [gib_text(r["estimated_reserved_bytes"])]
            cells.append(_pct_or_na(r["simulated_reserved_error_pct"]))
        lines.append(sep.join(cells))
    if on_gpu:
        context = result["rows"][0]["estimated_outside_allocator_bytes"] if result["rows"] else 0
        lines.append(
            "outside: device memory outside torch's allocator after the length (CUDA's total - "
            f"free - reserved: context, library handles); the estimate's peak adds "
            f"{gib_text(context)} GiB for it (profile {result['profile']})"
        )
    if result.get("speed"):
        lines.append(f"tokens/s on {result['gpu']} (the estimate's time model for this card):")
        lines.append(sep.join(["seq", "measured", "estimated", "error %"]))
        for s in result["speed"]:
            measured, estimated = s["measured_tokens_per_second"], s["estimated_tokens_per_second"]
            cells = [str(s["seq_len"]), _count_or_na(measured), _count_or_na(estimated)]
            lines.append(sep.join([*cells, _pct_or_na(s["error_pct"])]))
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def _count_or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _pct_or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


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
