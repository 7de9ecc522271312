"""`trainfit-probe`: the memory test on the command line.

Exit codes: 0 the test ran (whatever the per-length statuses; an OOM is a result), 2 bad input
(message naming the field on stderr), 1 the memtest could not be written or uploaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

from memtest_schema import SETUP_CHOICES, STACK_SETUP_FIELDS, STACKS, MemtestSchemaError

__all__ = ["main", "build_parser"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() owns the exit code and message."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _choices(field: str) -> tuple[str, ...]:
    values = SETUP_CHOICES[field]
    assert values is not None
    return values


def build_parser() -> argparse.ArgumentParser:
    """The option set; setup options mirror the estimator's `TrainingSetup` field names."""
    p = _Parser(
        prog="trainfit-probe",
        description="Run training steps of a model built from config.json and record peak "
        "memory per sequence length as a trainfit.memtest/1 JSON document.",
    )
    p.add_argument("--config", required=True, help="model config.json (random weights are used)")
    p.add_argument("--name", help="model name in the memtest (default: the config file's stem)")
    s = p.add_argument_group("training setup (the estimator's TrainingSetup)")
    s.add_argument("--method", choices=_choices("method"), default="full")
    s.add_argument("--lora-rank", type=int, default=16)
    s.add_argument("--lora-alpha", type=float, default=None)
    s.add_argument("--lora-targets", default="all-linear", help="a,b,c or all-linear")
    s.add_argument(
        "--adapter-dtype",
        choices=_choices("adapter_dtype"),
        default=None,
        help="default fp32 (peft); torchtune: the model's dtype",
    )
    s.add_argument("--optimizer", choices=_choices("optimizer"), default="adamw")
    s.add_argument(
        "--precision",
        choices=_choices("precision"),
        default=None,
        help="default mixed; torchtune: bf16 (its recipes' dtype, no AMP)",
    )
    s.add_argument("--checkpointing", choices=_choices("checkpointing"), default="gpu")
    s.add_argument("--loss", choices=_choices("loss"), default="full")
    s.add_argument("--loss-chunk", type=int, default=4096)
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--attention", choices=_choices("attention"), default="sdpa")
    k = p.add_argument_group("training stack (issue 11: what runs the steps)")
    k.add_argument(
        "--stack",
        choices=STACKS,
        default="probe",
        help="hf: transformers Trainer + peft (+ bitsandbytes); torchtune: torchtune's "
        "single-device LoRA / full recipes (needs the torchtune extra); torchtitan: its Trainer "
        "(FSDP2, gloo, --device cpu, under torchrun for N ranks; or --device fake --ranks N; "
        "needs the torchtitan extra); "
        "probe: the probe's own loop; unsloth/deepspeed: reported as not runnable here",
    )
    k.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (hf default: on unless --precision fp32)",
    )
    k.add_argument(
        "--optimizer-impl",
        choices=STACK_SETUP_FIELDS["optimizer_impl"],
        default=None,
        help="hf default: fused for AdamW",
    )
    k.add_argument("--paged", action="store_true", help="bitsandbytes paged optimizer (CUDA)")
    k.add_argument("--lora-dropout", type=float, default=0.0)
    k.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    k.add_argument(
        "--eval-batch",
        type=int,
        default=None,
        help="after each length's steps, measure Trainer.evaluate() on this many rows (hf)",
    )
    k.add_argument("--double-quant", action="store_true", help="QLoRA bnb_4bit_use_double_quant")
    k.add_argument(
        "--objective",
        choices=("sft", "dpo", "kto", "orpo", "cpo", "simpo"),
        default="sft",
        help="dpo: the installed TRL's DPOTrainer (--stack hf; --loss chunked from TRL 1.10, "
        "--loss full up to 1.9); orpo, cpo: TRL 1.0-1.9's ORPOTrainer, CPOTrainer; simpo: "
        "their CPOTrainer with loss_type simpo, cpo_alpha 0 (--loss full); --batch preference "
        "pairs",
    )
    r = p.add_argument_group("the run")
    r.add_argument("--sweep", default="16000,32000,48000", help="comma-separated seq lengths")
    r.add_argument("--steps", type=int, default=3, help="optimizer steps per length")
    r.add_argument("--device", choices=("cuda", "cpu", "fake"), default="cuda")
    r.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="--stack torchtitan --device fake: data-parallel ranks torchtitan's fake backend "
        "simulates (FSDP2 shards over them; rank 0 is traced)",
    )
    r.add_argument(
        "--memory-cap", type=int, default=None, help="cpu/fake: raise OOM above this many bytes"
    )
    r.add_argument(
        "--time-limit", type=float, default=None, help="start no new length after this many seconds"
    )
    r.add_argument(
        "--timings",
        action="store_true",
        help="print each phase (model built, each length started and ended) with the seconds "
        "since the start to stderr",
    )
    r.add_argument(
        "--simulate-reserved",
        action="store_true",
        help="cpu/fake: replay the run's allocations through the simulated CUDA caching "
        "allocator and record each length's simulated_reserved_bytes",
    )
    r.add_argument("--out", help="output file (default memtest_<model>_<gpu>_<date>.json)")
    r.add_argument("--upload", metavar="URL", help="POST the memtest to URL (e.g. .../v1/memtests)")
    r.add_argument("--token", help="bearer token for --upload (default: $TRAINFIT_TOKEN)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _setup_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "method": args.method,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "lora_targets": [t for t in args.lora_targets.split(",")],
        "adapter_dtype": args.adapter_dtype,
        "optimizer": args.optimizer,
        "precision": args.precision,
        "checkpointing": args.checkpointing,
        "loss": args.loss,
        "loss_chunk": args.loss_chunk,
        "batch": args.batch,
        "attention": args.attention,
        "stack": args.stack,
        "autocast": args.autocast,
        "optimizer_impl": args.optimizer_impl,
        "paged": args.paged,
        "lora_dropout": args.lora_dropout,
        "grad_accum": args.grad_accum,
        "eval_batch": args.eval_batch,
        "double_quant": args.double_quant,
        "objective": args.objective,
    }


def _summary(doc: dict[str, Any]) -> str:
    """One line per length: status, peak in bytes and GiB (2^30), tokens per second."""
    gib = 2**30
    simulated = any("simulated_reserved_bytes" in r for r in doc["results"])
    head = f"{'seq_len':>8} {'status':>7} {'peak bytes':>15} {'peak GiB':>9} {'tokens/s':>10}"
    lines = [head + (f" {'sim. reserved GiB':>17}" if simulated else "")]
    for r in doc["results"]:
        peak = r["peak_allocated_bytes"]
        tps = r["tokens_per_second"]
        line = (
            f"{r['seq_len']:>8} {r['status']:>7} "
            f"{(f'{peak:,}' if peak is not None else '-'):>15} "
            f"{(f'{peak / gib:.2f}' if peak is not None else '-'):>9} "
            f"{(f'{tps:.0f}' if tps is not None else '-'):>10}"
        )
        if simulated:
            res = r.get("simulated_reserved_bytes")
            line += f" {(f'{res / gib:.2f}' if res is not None else '-'):>17}"
        lines.append(line)
    return "\n".join(lines)


def _print_phase(line: str) -> None:
    print(f"trainfit-probe: {line}", file=sys.stderr, flush=True)


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically (a temporary file renamed), so a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _save(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """Write the memtest to `--out` (or its default name) and print its summary."""
    from probe.runner import default_out_name

    out = Path(args.out) if args.out else Path(default_out_name(doc))
    try:
        _write(out, doc)
    except OSError as exc:
        print(f"trainfit-probe: error: out: cannot write {out}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(_summary(doc))
    print(f"wrote {out}")
    return EXIT_OK


def _run_torchtitan(args: argparse.Namespace, raw: list[str], config: dict[str, Any]) -> int:
    """`--stack torchtitan` (probe/torchtitan_stack.py); rank 0 writes the memtest."""
    from probe.stacks import check_stack
    from probe.torchtitan_stack import run_torchtitan, torchtitan_setup

    setup = torchtitan_setup(_setup_from_args(args))
    check_stack(setup, args.device)
    doc, _ = run_torchtitan(
        config,
        setup,
        args.sweep,
        steps=args.steps,
        device=args.device,
        name=args.name or Path(args.config).stem,
        command="trainfit-probe " + shlex.join(raw),
        ranks=args.ranks,
    )
    if args.device != "fake" and int(os.environ.get("RANK", "0")) != 0:
        return EXIT_OK
    return _save(args, doc)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `trainfit-probe` and `python -m probe`."""
    raw = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(raw)
    except _UsageError as exc:
        print(f"trainfit-probe: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from probe.config import load_config
    from probe.options import ProbeInputError

    try:
        config = load_config(args.config)
        try:
            import torch  # noqa: F401
        except ImportError:
            print("trainfit-probe: error: torch is not installed", file=sys.stderr)
            return EXIT_BAD_INPUT
        from probe.runner import default_out_name, run_probe

        if args.stack == "torchtitan":  # torchtitan's own Trainer runs the steps
            if args.simulate_reserved:
                raise ProbeInputError(
                    "simulate_reserved", "not with --stack torchtitan (one trace per rank)"
                )
            return _run_torchtitan(args, raw, config)
        if args.simulate_reserved and (args.device == "cuda" or args.stack == "torchtune"):
            raise ProbeInputError(
                "simulate_reserved",
                "for cpu and fake runs of the probe and hf stacks (CUDA measures reserved itself)",
            )

        def write_partial(partial: dict[str, Any]) -> None:
            target = Path(args.out) if args.out else Path(default_out_name(partial))
            with contextlib.suppress(OSError):  # reported when the final document is written
                _write(target, partial)

        recording: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(None)
        if args.simulate_reserved:
            from probe.allocator_trace import record_probe_tracker

            recording = record_probe_tracker()
        with recording as trace:
            doc = run_probe(
                config,
                _setup_from_args(args),
                args.sweep,
                steps=args.steps,
                device=args.device,
                memory_cap=args.memory_cap,
                name=args.name or Path(args.config).stem,
                command="trainfit-probe " + shlex.join(raw),
                progress=not args.no_progress,
                time_limit=args.time_limit,
                on_result=write_partial,
                log=_print_phase if args.timings else None,
            )
        if trace is not None:
            from memtest_schema import validate_memtest
            from probe.simulated_reserved import add_simulated_reserved

            add_simulated_reserved(doc, trace.cuda_events())
            doc = validate_memtest(doc)
    except ProbeInputError as exc:
        print(f"trainfit-probe: error: {exc.field}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemtestSchemaError as exc:  # a bug: the probe built an invalid document
        print(f"trainfit-probe: internal error: memtest invalid: {exc}", file=sys.stderr)
        return EXIT_FAILED

    from probe.distributed import DistributedRun

    if DistributedRun.from_env(args.device).rank != 0:
        return EXIT_OK  # rank 0 writes the file
    saved = _save(args, doc)
    if saved != EXIT_OK:
        return saved
    if args.upload:
        from probe.upload import UploadError, upload_memtest

        token = args.token or os.environ.get("TRAINFIT_TOKEN")
        try:
            memtest_id = upload_memtest(args.upload, doc, token)
        except UploadError as exc:
            print(f"trainfit-probe: error: upload: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"uploaded as {memtest_id}")
    return EXIT_OK


def console_main() -> None:
    """`trainfit-probe` and `python -m probe`: `main()`, then the process exits. A run under
    torchrun (WORLD_SIZE > 1) has written its file and destroyed its process group by then; it
    leaves with `os._exit` after flushing, skipping the interpreter's teardown, where a library
    thread still joinable at exit aborted rank 1 now and then ("terminate called without an
    active exception", SIGABRT, after rank 0 had written the memtest: 1 run in 6 here with torch
    2.13.0 and gloo)."""
    code = main()
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
