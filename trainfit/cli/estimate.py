"""`trainfit estimate` (memory, time and cost per GPU option) and `trainfit check` (exit 0 when
the setup fits the one GPU, 1 when it does not)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainfit.cli import common


def cmd_estimate(args: argparse.Namespace) -> int:
    from estimator.document import estimate_document
    from estimator.formats import render_csv, render_markdown, render_table
    from estimator.plain_request import estimate_request  # pydantic only when needed
    from trainfit.cli.train_config import attach_report

    setup, variants = common.setup_input(args)
    req = estimate_request(
        {
            "model": common.model_input(args),
            "setup": setup,
            "seq_lens": common.int_list(args.seq, "--seq"),
            "gpus": common.csv_list(args.gpu),
            "usable_fraction": args.usable,
            "profile": args.profile,
            **common.run_fields(args),
        }
    )
    doc = attach_report(estimate_document(req, variants), args)  # type: ignore[arg-type]  # + setup.ignored, train_config
    if args.format == "json":
        common.write_json(doc)
    elif args.format == "csv":
        sys.stdout.write(render_csv(doc))
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(doc))
    else:
        sys.stdout.write(render_table(doc, colour=sys.stdout.isatty()))
    return common.EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """Every listed GPU is checked; exit 0 only when the run fits all of them."""
    from trainfit.cli.train_config import attach_report

    setup, variants = common.setup_input(args)
    if variants:
        raise common.InputError("check: give one --checkpointing and one --loss")
    body = {
        "model": common.model_input(args),
        "setup": setup,
        "seq_lens": common.int_list(args.seq, "--seq"),
        "usable_fraction": args.usable,
        "profile": args.profile,
    }
    results = []
    for gpu in common.csv_list(args.gpu) or [args.gpu]:
        one = {**body, "gpu": gpu}
        result = _check_remote(args, one) if args.server else _check_local(one)
        results.append(attach_report(result, args))  # + setup.ignored, train_config
    if args.format == "json":
        common.write_json(results[0] if len(results) == 1 else results)
    else:
        for result in results:
            sys.stdout.write(
                f"{result['verdict']}: peak {common.gib_text(result['peak_bytes'])} GiB at seq "
                f"{result['seq_len']} on {result['gpu']}, usable "
                f"{common.gib_text(result['usable_bytes'])} GiB ({result['usable_fraction']:.0%}), "
                f"margin {common.gib_text(result['margin_bytes'])} GiB\n"
            )
    return common.EXIT_OK if all(r["fits"] for r in results) else common.EXIT_NO_FIT


def _check_local(body: dict[str, Any]) -> dict[str, Any]:
    from estimator.document import check_document
    from estimator.plain_request import check_request  # pydantic only when needed

    return check_document(check_request(body))  # type: ignore[arg-type]


def _check_remote(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    from app.client import RemoteUnavailableError, check_remote  # the service's client (httpx)

    try:
        result: dict[str, Any] = check_remote(args.server, body, timeout=args.timeout)
    except RemoteUnavailableError as err:
        raise common.ServerUnavailable(str(err)) from None
    return result


def register(sub: Any) -> None:
    est = common.add_command(
        sub,
        "estimate",
        "memory per component, time, cost and the verdict per GPU",
        "trainfit estimate --model llama-3.1-8b --method lora --seq 8192,16384 --gpu h200,2xh200",
    )
    common.add_model_options(est)
    common.add_setup_options(est)
    common.add_run_options(est)
    est.add_argument("--gpu", default="a100-80gb,h100-80gb,h200", help="GPU ids, e.g. h200,2xh200")
    est.add_argument(
        "--format", default="table", choices=["table", "json", "csv", "markdown"], help="output"
    )
    est.set_defaults(func=cmd_estimate)

    chk = common.add_command(
        sub,
        "check",
        "exit 0 if the setup fits every GPU given, 1 if not, 2 bad input, 3 server unreachable",
        "trainfit check --train-config examples/train_configs/axolotl-qlora-llama31-8b.yml "
        "--gpu h100-80gb",
    )
    common.add_model_options(chk)
    common.add_setup_options(chk, lists=False)
    chk.add_argument("--gpu", required=True, help="GPU ids, e.g. h100-80gb or a100-80gb,h200")
    chk.add_argument("--server", help="ask a trainfit server instead of computing locally")
    chk.add_argument("--timeout", type=float, default=30.0, help="seconds, with --server")
    chk.add_argument("--format", default="table", choices=["table", "json"], help="output")
    chk.set_defaults(func=cmd_check)
