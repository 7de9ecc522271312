"""`trainfit` command line: estimate, check, compare, serve.

Exit codes: 0 success (check: fits), 1 check: tight or no, 2 bad input (message names the field).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from estimator.errors import EstimatorInputError
from estimator.stacks.options import CHECKPOINTING, LOSSES, add_stack_options, stack_overrides

EXIT_OK, EXIT_NO_FIT, EXIT_BAD_INPUT = 0, 1, 2
MAX_CONFIG_BYTES = 5 * 2**20


class InputError(Exception):
    """Bad command-line input; printed without a traceback, exit code 2."""


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str, field: str) -> list[int]:
    try:
        values = [int(float(t)) for t in _csv(text)]
    except ValueError:
        raise InputError(f"{field}: expected comma-separated integers, got {text!r}") from None
    if not values:
        raise InputError(f"{field}: give at least one value")
    return values


def read_json_file(path: str, field: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{field}: no such file {path!r}")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{field}: {path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{field}: {path} is not valid JSON ({err})") from None


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of --model or --params)")
    g.add_argument("--model", help="path to a config.json, or a preset id (see `trainfit presets`)")
    g.add_argument("--params", type=float, help="params-only spec, e.g. 8.08e9")
    g.add_argument("--hidden", type=int)
    g.add_argument("--layers", type=int)
    g.add_argument("--vocab", type=int)
    g.add_argument("--intermediate", type=int)
    g.add_argument("--name", help="model name shown in outputs")


def add_setup_options(p: argparse.ArgumentParser, lists: bool = True) -> None:
    g = p.add_argument_group("training setup")
    g.add_argument("--method", default="full", choices=["full", "lora", "qlora"])
    g.add_argument("--lora-rank", type=int, default=16)
    g.add_argument("--lora-alpha", type=float)
    g.add_argument("--lora-targets", default="all-linear", help="comma list or all-linear")
    g.add_argument("--adapter-config", help="a PEFT adapter_config.json (sets rank, targets)")
    g.add_argument("--adapter-dtype", default="fp32", choices=["fp32", "bf16"])
    g.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"],
    )
    g.add_argument("--precision", default="mixed", choices=["mixed", "bf16", "fp32"])
    g.add_argument(
        "--checkpointing",
        help=f"{'|'.join(CHECKPOINTING)}; a comma list adds rows"
        if lists
        else "|".join(CHECKPOINTING),
    )
    g.add_argument(
        "--loss", help=f"{'|'.join(LOSSES)}; a comma list adds rows" if lists else "|".join(LOSSES)
    )
    g.add_argument("--loss-chunk", type=int, help="positions per chunk per row")
    add_stack_options(g)
    g.add_argument("--seq", default="4096", help="sequence lengths, e.g. 16000,32000,48000")
    g.add_argument("--batch", type=int, default=1, help="micro-batch per device")
    g.add_argument("--gpus", type=int, default=1, help="number of GPUs the run shards over")
    g.add_argument(
        "--sharding",
        default="none",
        choices=["none", "fsdp", "zero1", "zero2", "zero3", "device_map"],
    )
    g.add_argument("--attention", default="sdpa", choices=["sdpa", "flash", "eager"])
    g.add_argument("--usable", type=float, default=0.92, help="usable fraction of each card")
    g.add_argument("--profile", default="default", help="assumption profile (default, seed-000)")


def model_input(args: argparse.Namespace) -> dict[str, Any]:
    if (args.model is None) == (args.params is None):
        raise InputError("model: give exactly one of --model (config.json or preset) or --params")
    if args.params is not None:
        out: dict[str, Any] = {"params": args.params}
        for k in ("hidden", "layers", "vocab", "intermediate"):
            if getattr(args, k) is not None:
                out[k] = getattr(args, k)
    elif Path(args.model).suffix == ".json" or Path(args.model).is_file():
        out = {"config": read_json_file(args.model, "--model")}
    else:
        out = {"preset": args.model}
    if args.name:
        out["name"] = args.name
    return out


def setup_input(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    setup: dict[str, Any] = {
        "method": args.method,
        "lora_rank": args.lora_rank,
        "lora_targets": _csv(args.lora_targets),
        "adapter_dtype": args.adapter_dtype,
        "optimizer": args.optimizer,
        "precision": args.precision,
        **stack_overrides(args),
        "batch": args.batch,
        "num_gpus": args.gpus,
        "sharding": args.sharding,
        "attention": args.attention,
    }
    if args.lora_alpha is not None:
        setup["lora_alpha"] = args.lora_alpha
    if args.adapter_config:
        adapter = read_json_file(args.adapter_config, "--adapter-config")
        if not isinstance(adapter, dict):
            raise InputError("--adapter-config: expected a JSON object")
        if "r" in adapter:
            setup["lora_rank"] = adapter["r"]
        targets = adapter.get("target_modules")
        if targets is not None:
            setup["lora_targets"] = [targets] if isinstance(targets, str) else targets
        if setup["method"] == "full":
            setup["method"] = "lora"
    given = ["-" if v is None else v for v in (args.checkpointing, args.loss)]
    checkpointing, losses = _csv(given[0]), _csv(given[1])
    for name, values, allowed in (
        ("--checkpointing", checkpointing, CHECKPOINTING + ("-",)),
        ("--loss", losses, LOSSES + ("-",)),
    ):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise InputError(f"{name}: {', '.join(bad) or 'empty'} not one of {', '.join(allowed)}")
    setup.update(
        {k: v[0] for k, v in (("checkpointing", checkpointing), ("loss", losses)) if v != ["-"]}
    )
    variants = [
        {k: v for k, v in (("checkpointing", c), ("loss", lo)) if v != "-"}
        for c in checkpointing
        for lo in losses
    ]
    return setup, variants if len(variants) > 1 else []


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "request"
    return f"{loc}: {first['msg']}"


def add_run_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tokens, time and cost")
    g.add_argument("--tokens", type=float, help="tokens of the run, e.g. 6.4e6 or 2e12")
    g.add_argument("--target-tokens", choices=["chinchilla"], help="20 tokens per parameter")
    g.add_argument("--dataset", help="sample lengths: .csv, .jsonl or one number per line")
    g.add_argument("--epochs", type=float, default=1.0)
    g.add_argument("--truncate", action="store_true", help="truncate long samples, not drop")
    g.add_argument("--price", action="append", default=[], help="ID=USD per GPU-hour")
    g.add_argument("--calibrate", help="gpu=ID,seq=N,batch=N,tps=X (or step=X), or memtest.json")


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    from estimator.pricing import parse_calibrate_option, parse_price_option
    from estimator.tokens import read_lengths

    fields: dict[str, Any] = {
        "epochs": args.epochs,
        "overflow": "truncate" if args.truncate else "drop",
    }
    if args.tokens is not None:
        fields["tokens"] = args.tokens
    if args.target_tokens:
        fields["target_tokens"] = args.target_tokens
    if args.dataset:
        if not Path(args.dataset).is_file():
            raise InputError(f"--dataset: no such file {args.dataset!r}")
        fields["dataset_lengths"] = read_lengths(args.dataset, field="--dataset")
    if args.price:
        fields["prices"] = parse_price_option(args.price)
    if args.calibrate:
        fields["calibration"] = _calibration_fields(parse_calibrate_option(args.calibrate), args)
    return fields


def _calibration_fields(parsed: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A memtest file becomes its first `ok` result with step times (median of the steps)."""
    if "memtest" not in parsed:
        return parsed
    from estimator.calibration import calibrate_from_memtest
    from estimator.profile import load_profile
    from memtest_schema import MemtestSchemaError, load_memtest, validate_memtest

    path = Path(parsed["memtest"])
    if not path.is_file():
        raise InputError(f"--calibrate: no such file {str(path)!r}")
    try:
        doc = validate_memtest(load_memtest(path.read_bytes()))
    except MemtestSchemaError as err:
        raise InputError(f"--calibrate: memtest.{err.field}: {err.message}") from None
    first = calibrate_from_memtest(doc, load_profile(args.profile))[0]
    return {
        "gpu": first.gpu_option,
        "seq_len": first.seq_len,
        "batch": first.batch,
        "step_seconds": first.step_seconds,
    }


def cmd_estimate(args: argparse.Namespace) -> int:
    from estimator.api import estimate_document
    from estimator.formats import render_csv, render_markdown, render_table
    from estimator.request import EstimateRequest

    setup, variants = setup_input(args)
    req = EstimateRequest.model_validate(
        {
            "model": model_input(args),
            "setup": setup,
            "seq_lens": _ints(args.seq, "--seq"),
            "gpus": _csv(args.gpu),
            "usable_fraction": args.usable,
            "profile": args.profile,
            **run_fields(args),
        }
    )
    doc = estimate_document(req, variants)
    if args.format == "json":
        out = json.dumps(doc, indent=2) + "\n"
    elif args.format == "csv":
        out = render_csv(doc)
    elif args.format == "markdown":
        out = render_markdown(doc)
    else:
        out = render_table(doc, colour=sys.stdout.isatty())
    sys.stdout.write(out)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    from estimator.request import CheckRequest

    setup, variants = setup_input(args)
    if variants:
        raise InputError("check: give one --checkpointing and one --loss")
    body = {
        "model": model_input(args),
        "setup": setup,
        "seq_lens": _ints(args.seq, "--seq"),
        "gpu": args.gpu,
        "usable_fraction": args.usable,
        "profile": args.profile,
    }
    if args.server:
        from app.client import check_remote  # the service's client (httpx)

        result = check_remote(args.server, body, timeout=args.timeout)
    else:
        from estimator.api import check_document

        result = check_document(CheckRequest.model_validate(body))
    if args.format == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(
            f"{result['verdict']}: peak {gib_text(result['peak_bytes'])} GiB at seq "
            f"{result['seq_len']} on {result['gpu']}, usable {gib_text(result['usable_bytes'])} "
            f"GiB ({result['usable_fraction']:.0%}), "
            f"margin {gib_text(result['margin_bytes'])} GiB\n"
        )
    return EXIT_OK if result["fits"] else EXIT_NO_FIT


def gib_text(value: int) -> str:
    return f"{value / 2**30:.1f}"


def cmd_compare(args: argparse.Namespace) -> int:
    from estimator.api import compare_memtest
    from memtest_schema import MemtestSchemaError, load_memtest, validate_memtest

    path = Path(args.memtest)
    if not path.is_file():
        raise InputError(f"memtest: no such file {args.memtest!r}")
    try:
        doc = validate_memtest(load_memtest(path.read_bytes()))
    except MemtestSchemaError as err:
        raise InputError(f"memtest.{err.field}: {err.message}") from None
    result = compare_memtest(doc, args.profile)
    if args.format == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return EXIT_OK
    sep = "|" if args.format == "markdown" else " "
    header = ["seq", "status", "measured GiB", "estimated GiB", "error GiB", "error %"]
    lines = [sep.join(header)]
    for r in result["rows"]:
        m = r["measured_peak_bytes"]
        lines.append(
            sep.join(
                [
                    str(r["seq_len"]),
                    str(r["status"]),
                    "n/a" if m is None else gib_text(m),
                    gib_text(r["estimated_peak_bytes"]),
                    "n/a" if r["error_bytes"] is None else gib_text(r["error_bytes"]),
                    "n/a" if r["error_pct"] is None else f"{r['error_pct']:+.1f}",
                ]
            )
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK


def cmd_presets(args: argparse.Namespace) -> int:
    from estimator.api import list_presets

    for p in list_presets():
        sys.stdout.write(
            f"{p['id']:<16} {p['model_type']:<12} {p['params_total']:>16,}  {p['source']}\n"
        )
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from app.server import serve
    except ImportError as err:
        raise InputError(
            f"serve: the service is not installed ({err}); pip install '.[service]'"
        ) from None
    serve(host=args.host, port=args.port, database_url=args.database_url)
    return EXIT_OK


def _solver_request(args: argparse.Namespace, needs_seq: bool) -> Any:
    from estimator.request import SolverRequest

    setup_dict, variants = setup_input(args)
    if variants:
        raise InputError("give one --checkpointing and one --loss (or use `trainfit recommend`)")
    return SolverRequest.model_validate(
        {
            "model": model_input(args),
            "setup": setup_dict,
            "gpu": args.gpu,
            "seq_len": _ints(args.seq, "--seq")[0] if needs_seq else None,
            "granularity": args.granularity,
            "usable_fraction": args.usable,
            "profile": args.profile,
        }
    )


def _print_answer(args: argparse.Namespace, answer: dict[str, Any], headline: str) -> None:
    if args.format == "json":
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        return
    lines = [headline]
    for key in (
        "peak_bytes",
        "next_peak_bytes",
        "peak_bytes_one_fewer",
        "usable_bytes",
        "margin_bytes",
    ):
        if answer.get(key) is not None:
            lines.append(f"  {key.replace('_bytes', '')}: {gib_text(answer[key])} GiB")
    if answer.get("reason"):
        lines.append(f"  note: {answer['reason']}")
    text = "\n".join(lines)
    if args.format == "markdown":
        text = (
            "\n".join(
                ["| quantity | value |", "|---|---|"]
                + [
                    "| " + " | ".join(part.strip() for part in line.split(":", 1)) + " |"
                    for line in lines[1:]
                ]
            )
            + f"\n\n{headline}"
        )
    sys.stdout.write(text + "\n")


def cmd_max_seq(args: argparse.Namespace) -> int:
    from estimator.api import max_seq_document

    answer = max_seq_document(_solver_request(args, needs_seq=False))
    value = answer["seq_len"]
    head = (
        f"longest sequence on {args.gpu}: {value} tokens (granularity {args.granularity})"
        if value
        else f"nothing fits on {args.gpu}: {answer.get('reason')}"
    )
    _print_answer(args, answer, head)
    return EXIT_OK if value else EXIT_NO_FIT


def cmd_max_batch(args: argparse.Namespace) -> int:
    from estimator.api import max_batch_document

    req = _solver_request(args, needs_seq=True)
    answer = max_batch_document(req)
    value = answer["batch"]
    head = (
        f"largest micro-batch at {req.seq_len} tokens on {args.gpu}: {value}"
        if value
        else f"nothing fits on {args.gpu}: {answer.get('reason')}"
    )
    _print_answer(args, answer, head)
    return EXIT_OK if value else EXIT_NO_FIT


def cmd_min_gpus(args: argparse.Namespace) -> int:
    from estimator.api import min_gpus_document

    req = _solver_request(args, needs_seq=True)
    answer = min_gpus_document(req)
    value = answer["gpus"]
    head = (
        f"fewest {args.gpu} cards ({answer['sharding']}) at {req.seq_len} tokens: {value}"
        if value
        else f"no number of {args.gpu} cards fits"
    )
    _print_answer(args, answer, head)
    return EXIT_OK if value else EXIT_NO_FIT


def cmd_recommend(args: argparse.Namespace) -> int:
    from estimator.api import recommend_document
    from estimator.recommend import render_recommendation
    from estimator.request import RecommendRequest

    setup_dict, _ = setup_input(args)
    fields = run_fields(args)
    fields.pop("calibration", None)
    fields.pop("target_tokens", None)
    doc = recommend_document(
        RecommendRequest.model_validate(
            {
                "model": model_input(args),
                "setup": setup_dict,
                "gpus": _csv(args.gpu),
                "seq_len": _ints(args.seq, "--seq")[0] if args.seq else None,
                "usable_fraction": args.usable,
                "profile": args.profile,
                **fields,
            }
        )
    )
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_recommendation(doc, args.format))
    return EXIT_OK


def cmd_db(args: argparse.Namespace) -> int:
    """`trainfit db backup FILE` / `trainfit db restore FILE [--replace]` (app.backup)."""
    import os

    try:
        from app.backup import BackupError, backup, restore
    except ImportError as err:
        raise InputError(
            f"db: the service is not installed ({err}); pip install '.[service]'"
        ) from None
    url = args.database_url or os.environ.get("TRAINFIT_DATABASE_URL") or "sqlite:///trainfit.db"
    try:
        if args.action == "backup":
            summary = backup(url, args.file)
        else:
            summary = restore(url, args.file, replace=args.replace)
    except BackupError as err:
        raise InputError(f"db {args.action}: {err}") from None
    counts = ", ".join(f"{k} {v}" for k, v in summary.counts.items())
    sys.stdout.write(f"{args.action}: {summary.path} ({counts})\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainfit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    est = sub.add_parser("estimate", help="memory per component and fit per GPU")
    add_model_options(est)
    add_setup_options(est)
    add_run_options(est)
    est.add_argument("--gpu", default="a100-80gb,h100-80gb,h200", help="GPU ids, e.g. h200,2xh200")
    est.add_argument("--format", default="table", choices=["table", "json", "csv", "markdown"])
    est.set_defaults(func=cmd_estimate)

    chk = sub.add_parser("check", help="exit 0 if the setup fits the GPU, 1 if not, 2 bad input")
    add_model_options(chk)
    add_setup_options(chk, lists=False)
    chk.add_argument("--gpu", required=True)
    chk.add_argument("--server", help="ask a trainfit server instead of computing locally")
    chk.add_argument("--timeout", type=float, default=30.0)
    chk.add_argument("--format", default="table", choices=["table", "json"])
    chk.set_defaults(func=cmd_check)

    cmp_ = sub.add_parser("compare", help="estimate vs a measured memtest_*.json")
    cmp_.add_argument("memtest")
    cmp_.add_argument("--profile", default="default")
    cmp_.add_argument("--format", default="table", choices=["table", "json", "markdown"])
    cmp_.set_defaults(func=cmd_compare)

    for name, func, helptext in (
        ("max-seq", cmd_max_seq, "longest sequence that fits a GPU"),
        ("max-batch", cmd_max_batch, "largest micro-batch that fits a GPU at --seq"),
        ("min-gpus", cmd_min_gpus, "fewest GPUs of a kind that fit, with --sharding"),
    ):
        solver = sub.add_parser(name, help=helptext)
        add_model_options(solver)
        add_setup_options(solver, lists=False)
        solver.add_argument("--gpu", required=True)
        solver.add_argument("--granularity", type=int, default=256)
        solver.add_argument("--format", default="table", choices=["table", "json", "markdown"])
        solver.set_defaults(func=func)

    rec = sub.add_parser("recommend", help="best fitting setting per GPU, cheapest first")
    add_model_options(rec)
    add_setup_options(rec, lists=False)
    add_run_options(rec)
    rec.set_defaults(seq=None)
    rec.add_argument("--gpu", default="a100-80gb,rtx-pro-6000,h200")
    rec.add_argument("--format", default="table", choices=["table", "json", "markdown"])
    rec.set_defaults(func=cmd_recommend)

    pre = sub.add_parser("presets", help="list the model presets")
    pre.set_defaults(func=cmd_presets)

    db = sub.add_parser("db", help="back up or restore the service's database")
    db.add_argument("action", choices=["backup", "restore"])
    db.add_argument("file", help="backup file (gzip'd JSON lines)")
    db.add_argument("--database-url", default=None, help="default $TRAINFIT_DATABASE_URL")
    db.add_argument("--replace", action="store_true", help="restore: empty the tables first")
    db.set_defaults(func=cmd_db)

    srv = sub.add_parser("serve", help="run the web service")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--database-url", default=None, help="default sqlite:///trainfit.db")
    srv.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except InputError as err:
        message = str(err)
    except EstimatorInputError as err:
        message = f"{err.field}: {err.message}"
    except ValidationError as err:
        message = _validation_message(err)
    except Exception as err:  # the service client's errors (connection, 4xx) carry their text
        if type(err).__module__.startswith(("app", "httpx")):
            message = str(err)
        else:
            raise
    sys.stderr.write(f"trainfit: error: {message}\n")
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
