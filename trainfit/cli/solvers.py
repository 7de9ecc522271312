"""The planner's questions: `trainfit max-seq`, `max-batch`, `min-gpus` (one shape, a table of
three rows) and `trainfit recommend` (the best setting per GPU, cheapest first)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from estimator.objective import batch_unit
from trainfit.cli.common import (
    EXIT_NO_FIT,
    EXIT_OK,
    InputError,
    add_command,
    add_model_options,
    add_run_options,
    add_setup_options,
    csv_list,
    gib_text,
    int_list,
    model_input,
    run_fields,
    setup_input,
    write_json,
)


class Question(NamedTuple):
    """One solver command: its name, what it answers, the document function that answers it
    (by name in `estimator.document`), the answer's key and how the headline reads. (A named
    tuple: a dataclass would load `dataclasses` and `inspect` into `trainfit --help`.)"""

    name: str
    help: str
    document: str
    answer_key: str
    needs_seq: bool
    headline: Callable[[argparse.Namespace, Any, dict[str, Any]], str]


QUESTIONS = (
    Question(
        "max-seq",
        "longest sequence that fits a GPU",
        "max_seq_document",
        "seq_len",
        False,
        lambda a, req, ans: (
            f"longest sequence on {req.gpu}: {ans['seq_len']} tokens (granularity {a.granularity})"
        ),
    ),
    Question(
        "max-batch",
        "largest micro-batch that fits a GPU at --seq",
        "max_batch_document",
        "batch",
        True,
        lambda a, req, ans: (
            f"largest micro-batch at {req.seq_len} tokens on {a.gpu}: {ans['batch']}"
            + (f" {batch_unit(req.setup.objective)}" if req.setup.objective != "sft" else "")
        ),
    ),
    Question(
        "min-gpus",
        "fewest GPUs of a kind that fit, with --sharding",
        "min_gpus_document",
        "gpus",
        True,
        lambda a, req, ans: (
            f"fewest {a.gpu} cards ({ans['sharding']}) at {req.seq_len} tokens: {ans['gpus']}"
        ),
    ),
)


def _solver_request(args: argparse.Namespace, gpu: str, needs_seq: bool) -> Any:
    from estimator.request import SolverRequest

    setup_dict, variants = setup_input(args)
    if variants:
        raise InputError("give one --checkpointing and one --loss (or use `trainfit recommend`)")
    return SolverRequest.model_validate(
        {
            "model": model_input(args),
            "setup": setup_dict,
            "gpu": gpu,
            "seq_len": int_list(args.seq, "--seq")[0] if needs_seq else None,
            "granularity": args.granularity,
            "usable_fraction": args.usable,
            "profile": args.profile,
            **_priced_fields(args),
        }
    )


def _priced_fields(args: argparse.Namespace) -> dict[str, Any]:
    """min-gpus prices its layouts with --tokens and --price."""
    out: dict[str, Any] = {}
    if getattr(args, "tokens", None) is not None:
        out["tokens"] = args.tokens
    if getattr(args, "within_days", None) is not None:
        out["within_days"] = args.within_days
    if getattr(args, "price", None):
        from estimator.time.cost import parse_price_option

        out["prices"] = parse_price_option(args.price)
    return out


def layout_table(doc: dict[str, Any]) -> str:
    """min-gpus with layout search: every layout tried on the answer's card count."""
    header = [
        "layout",
        "offload",
        "peak GiB",
        "fits",
        "tokens/s",
        "step s",
        "inter-node s",
        "days",
        "USD",
        "why not",
    ]
    body = []
    for r in doc.get("layouts", []):
        t, c = r.get("time") or {}, r.get("cost") or {}
        wall = t.get("wall_hours")
        body.append(
            [
                r["parallel"],
                r["offload"],
                "-" if r.get("peak_bytes") is None else gib_text(r["peak_bytes"]),
                "yes" if r["fits"] else "no",
                "-" if t.get("tokens_per_second") is None else f"{t['tokens_per_second']:,.0f}",
                "-" if t.get("step_seconds") is None else f"{t['step_seconds']:.2f}",
                "-"
                if t.get("comm_inter_node_seconds") is None
                else f"{t['comm_inter_node_seconds']:.2f}",
                "-" if wall is None else f"{wall / 24:.1f}",
                "-" if c.get("usd") is None else f"{c['usd']:,.0f}",
                r.get("reason", ""),
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    return (
        "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *body]
        )
        + "\n"
    )


def _search_text(args: argparse.Namespace, gpu: str, ans: dict[str, Any]) -> str:
    if not ans.get("gpus"):
        return f"no number of {gpu} cards fits: {ans.get('reason', '')}\n"
    cheap, fast = ans["cheapest"], ans["fastest"]

    def name(r: dict[str, Any]) -> str:
        offload = "" if r["offload"] == "none" else f" +offload {r['offload']}"
        return f"{r['parallel']}{offload}"

    def money(r: dict[str, Any]) -> str:
        t, c = r.get("time") or {}, r.get("cost") or {}
        parts = []
        if t.get("wall_hours") is not None:
            parts.append(f"{t['wall_hours'] / 24:.1f} days")
        if c.get("usd") is not None:
            parts.append(f"{c['usd']:,.0f} USD")
        return f" ({', '.join(parts)})" if parts else ""

    within = f" finishing within {ans['within_days']:g} days" if ans.get("within_days") else ""
    lines = [
        f"fewest {gpu} cards at {ans['seq_len']} tokens{within}: {ans['gpus']}",
        f"  cheapest layout: {name(cheap)}{money(cheap)}",
        f"  fastest layout:  {name(fast)}{money(fast)}",
        "",
        layout_table(ans),
    ]
    fewer = ans.get("fewer")
    if fewer:
        fastest = fewer.get("fastest")
        best = min(
            (r for r in fewer["layouts"] if r.get("peak_bytes")),
            key=lambda r: r["peak_bytes"],
            default=None,
        )
        if fastest:
            lines.append(
                f"on {fewer['gpus']} cards the fastest is {name(fastest)}{money(fastest)}\n"
            )
        elif best:
            lines.append(
                f"on {fewer['gpus']} cards the smallest peak is {name(best)}: {best['reason']}\n"
            )
    return "\n".join(lines)


def _answer_text(args: argparse.Namespace, answer: dict[str, Any], headline: str) -> str:
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
        rows = ["| quantity | value |", "|---|---|"] + [
            "| " + " | ".join(part.strip() for part in line.split(":", 1)) + " |"
            for line in lines[1:]
        ]
        text = "\n".join(rows) + f"\n\n{headline}"
    return text + "\n"


def answer_question(question: Question, args: argparse.Namespace) -> int:
    """One answer per GPU given; exit 0 when every GPU has one."""
    from estimator import document
    from trainfit.cli.train_config import attach_report

    answers, texts = [], []
    for gpu in csv_list(args.gpu) or [args.gpu]:
        req = _solver_request(args, gpu, needs_seq=question.needs_seq)
        answer = getattr(document, question.document)(req)
        if answer.get("search"):
            answers.append(attach_report(answer, args))
            texts.append(_search_text(args, gpu, answer))
            continue
        if answer[question.answer_key]:
            head = question.headline(args, req, answer)
        elif question.name == "min-gpus":
            head = f"no number of {gpu} cards fits"
        else:
            head = f"nothing fits on {gpu}: {answer.get('reason')}"
        answers.append(attach_report(answer, args))  # + setup.ignored, train_config
        texts.append(_answer_text(args, answer, head))
    if args.format == "json":
        write_json(answers[0] if len(answers) == 1 else answers)
    else:
        sys.stdout.write("\n".join(texts))
    return EXIT_OK if all(a[question.answer_key] for a in answers) else EXIT_NO_FIT


def cmd_recommend(args: argparse.Namespace) -> int:
    from estimator.document import recommend_document
    from estimator.recommend import render_recommendation
    from estimator.request import RecommendRequest
    from trainfit.cli.train_config import attach_report

    setup_dict, _ = setup_input(args)
    fields = run_fields(args)
    fields.pop("calibration", None)
    fields.pop("target_tokens", None)
    doc = recommend_document(
        RecommendRequest.model_validate(
            {
                "model": model_input(args),
                "setup": setup_dict,
                "gpus": csv_list(args.gpu),
                "seq_len": int_list(args.seq, "--seq")[0] if args.seq else None,
                "usable_fraction": args.usable,
                "profile": args.profile,
                **fields,
            }
        )
    )
    attach_report(doc, args)  # + setup.ignored, train_config
    if args.format == "json":
        write_json(doc)
    else:
        sys.stdout.write(render_recommendation(doc, args.format))
    return EXIT_OK


EXAMPLES = {
    "max-seq": "trainfit max-seq --model llama-3.1-8b --method qlora --gpu rtx-4090,h100-80gb",
    "max-batch": "trainfit max-batch --model llama-3.1-8b --method lora --seq 4096 --gpu h100-80gb",
    "min-gpus": "trainfit min-gpus --model llama-3.1-8b --seq 4096 --gpu h100 --tokens 2e12",
}


def register(sub: Any) -> None:
    for question in QUESTIONS:
        solver = add_command(sub, question.name, question.help, EXAMPLES[question.name])
        add_model_options(solver)
        add_setup_options(solver, lists=False)
        solver.add_argument("--gpu", required=True, help="GPU ids; a comma list answers each")
        solver.add_argument("--granularity", type=int, default=256, help="search step")
        if question.name == "min-gpus":
            solver.add_argument("--tokens", type=float, help="tokens of the run: prices layouts")
            solver.add_argument("--price", action="append", default=[], help="ID=USD per GPU-hour")
            solver.add_argument(
                "--within-days", type=float, help="with --tokens: the run must end in D days"
            )
        solver.add_argument(
            "--format", default="table", choices=["table", "json", "markdown"], help="output"
        )
        solver.set_defaults(func=lambda a, q=question: answer_question(q, a))

    rec = add_command(
        sub,
        "recommend",
        "best fitting setting per GPU, cheapest first",
        "trainfit recommend --model qwen3.5-27b --method lora --seq 32000 --tokens 6.4e6",
    )
    add_model_options(rec)
    add_setup_options(rec, lists=False)
    add_run_options(rec)
    rec.set_defaults(seq=None)
    rec.add_argument("--gpu", default="a100-80gb,rtx-pro-6000,h200", help="GPU ids to compare")
    rec.add_argument(
        "--format", default="table", choices=["table", "json", "markdown"], help="output"
    )
    rec.set_defaults(func=cmd_recommend)
