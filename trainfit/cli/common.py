"""What the `trainfit` commands share: exit codes, the model / setup / run options and how
they become request fields, JSON files read with a size cap, errors printed without a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from estimator.setup_choices import Optimizer
from trainfit.cli.stack_options import CHECKPOINTING, LOSSES, add_stack_options, stack_overrides

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_OK, EXIT_NO_FIT, EXIT_BAD_INPUT, EXIT_UNREACHABLE = 0, 1, 2, 3
MAX_CONFIG_BYTES = 5 * 2**20


class InputError(Exception):
    """Bad command-line input; printed without a traceback, exit code 2."""


class ServerUnavailable(Exception):
    """`--server` could not be reached, timed out, or failed (5xx): exit code 3, so that a CI
    job never reads an outage as "does not fit" (1) or as its own bad input (2)."""


def csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str, field: str) -> list[int]:
    try:
        values = [int(float(t)) for t in csv_list(text)]
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
    g.add_argument("--model", help="config.json path, preset id, or Hub id ORG/NAME[@revision]")
    g.add_argument("--params", type=float, help="params-only spec, e.g. 8.08e9")
    g.add_argument("--hidden", type=int, help="params-only: hidden size (for activations)")
    g.add_argument("--layers", type=int, help="params-only: decoder layers (for activations)")
    g.add_argument("--vocab", type=int, help="params-only: vocabulary (for the logits)")
    g.add_argument("--intermediate", type=int, help="params-only: MLP width (recompute peak)")
    g.add_argument("--name", help="model name shown in outputs")


def add_setup_options(p: argparse.ArgumentParser, lists: bool = True) -> None:
    g = p.add_argument_group("training setup")
    g.add_argument(
        "--train-config",
        action="append",
        help="axolotl/LLaMA-Factory/torchtune/TRL "
        "YAML or JSON (+ a DeepSpeed JSON / accelerate YAML); options given win",
    )
    g.add_argument(
        "--method", default="full", choices=["full", "lora", "qlora"], help="what trains"
    )
    g.add_argument("--lora-rank", type=int, default=16, help="LoRA r")
    g.add_argument("--lora-alpha", type=float, help="LoRA alpha (no memory effect)")
    g.add_argument(
        "--lora-targets",
        default="all-linear",
        help="comma list, all-linear, peft-default (what peft picks for the model type when "
        "target_modules is None), or re:PATTERN (peft regex over module names)",
    )
    g.add_argument(
        "--adapter-config",
        help="a PEFT adapter_config.json: rank, targets, dropout, modules_to_save, the base "
        "model (fills what a --train-config does not state); options given win",
    )
    g.add_argument(
        "--adapter-dtype", default="fp32", choices=["fp32", "bf16"], help="LoRA weights' dtype"
    )
    g.add_argument(
        "--optimizer",
        default="adamw",
        choices=get_args(Optimizer),
        help="optimizer (its states per trained parameter)",
    )
    g.add_argument(
        "--precision",
        choices=["mixed", "bf16", "fp32"],
        help="mixed = bf16 compute + fp32 master weights (the default; a full fine-tune on the "
        "unsloth stack: bf16, Unsloth's own)",
    )
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
    g.add_argument(
        "--batch", type=int, help="micro-batch per device (default 1; 2 under --objective kto)"
    )
    g.add_argument(
        "--padded-batches",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the micro-batch's rows carry padding (batch > 1 without packing): transformers "
        "builds a (b, 1, s, s) attention mask that SDPA copies per layer",
    )
    g.add_argument(
        "--num-gpus",
        "--gpus",
        dest="num_gpus",
        type=int,
        default=1,
        help="how many cards of each --gpu the run shards over (--gpus is the old name)",
    )
    g.add_argument(
        "--sharding",
        default="none",
        choices=["none", "fsdp", "zero1", "zero2", "zero3", "device_map"],
        help="legacy: fsdp|zero1|zero2|zero3 are aliases of --parallel with the same name "
        "(the exact FSDP2 / DeepSpeed model, every card a data-parallel rank); device_map "
        "splits the layers over the cards; --parallel wins when both are given",
    )
    g.add_argument(
        "--parallel",
        help="multi-GPU layout: dp | fsdp | hsdp | zero1|zero2|zero3 [=N], tp=N[,sp], cp=N, "
        "pp=N, ep=N, combined with commas (fsdp=8,tp=8); degrees multiply to the GPU count",
    )
    g.add_argument(
        "--fsdp-wrap",
        default=None,
        help="FSDP unit: layer or block-of-N, +embeddings / +lm_head as units of their own "
        "(torchtune custom_sharded_layers: layer+embeddings+lm_head); default: the stack's "
        "(torchtitan: layer+embeddings+norm_lm_head), else layer",
    )
    g.add_argument(
        "--reshard-after-forward",
        default="true",
        choices=["true", "false"],
        help="FSDP2 frees each unit's gathered parameters after its forward (default true)",
    )
    g.add_argument(
        "--offload",
        default="none",
        choices=["none", "optimizer", "params"],
        help="ZeRO optimizer offload; FSDP / ZeRO-3 parameter offload (to host memory)",
    )
    g.add_argument(
        "--pp-schedule",
        default="1f1b",
        choices=["1f1b", "interleaved-1f1b", "gpipe"],
        help="pipeline schedule under pp=N (torch.distributed.pipelining): 1f1b (default), "
        "interleaved-1f1b (--pp-virtual chunks per rank), gpipe",
    )
    g.add_argument(
        "--pp-virtual",
        type=int,
        help="interleaved-1f1b: model chunks (virtual stages) per pipeline rank (default 2)",
    )
    g.add_argument(
        "--attention",
        default="sdpa",
        choices=["sdpa", "flash", "eager", "xformers"],
        help="kernel (xformers: --stack unsloth)",
    )
    g.add_argument("--usable", type=float, default=0.92, help="usable fraction of each card")
    g.add_argument("--profile", default="default", help="assumption profile: default or seed-000")


def model_input(args: argparse.Namespace) -> dict[str, Any]:
    if (args.model is None) == (args.params is None):
        raise InputError("model: give exactly one of --model (config.json or preset) or --params")
    if args.params is not None:
        out: dict[str, Any] = {"params": args.params}
        for k in ("hidden", "layers", "vocab", "intermediate"):
            if getattr(args, k) is not None:
                out[k] = getattr(args, k)
    else:
        from estimator.hub import model_source  # file, preset (wins over) or Hub id ORG/NAME

        src = model_source(args.model)
        out = {"config": read_json_file(src["file"], "--model")} if "file" in src else src
    if args.name:
        out["name"] = args.name
    return out


def setup_input(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from estimator.lora import split_targets

    setup: dict[str, Any] = {
        "method": args.method,
        "lora_rank": args.lora_rank,
        "lora_targets": split_targets(args.lora_targets),
        "adapter_dtype": args.adapter_dtype,
        "optimizer": args.optimizer,
        **({"precision": args.precision} if args.precision is not None else {}),
        **stack_overrides(args),
        **({"batch": args.batch} if args.batch is not None else {}),
        "num_gpus": args.num_gpus,
        "sharding": args.sharding,
        "attention": args.attention,
    }
    if getattr(args, "parallel", None):
        setup.update(
            {
                "parallel": args.parallel,
                **({"fsdp_wrap": args.fsdp_wrap} if args.fsdp_wrap is not None else {}),
                "reshard_after_forward": args.reshard_after_forward == "true",
                "offload": args.offload,
            }
        )
    if getattr(args, "padded_batches", None) is not None:
        setup["padded_batches"] = args.padded_batches
    if getattr(args, "pp_schedule", "1f1b") != "1f1b":
        setup["pp_schedule"] = args.pp_schedule
    if getattr(args, "pp_virtual", None) is not None:
        setup["pp_virtual"] = args.pp_virtual
    if args.lora_alpha is not None:
        setup["lora_alpha"] = args.lora_alpha
    given = ["-" if v is None else v for v in (args.checkpointing, args.loss)]
    checkpointing, losses = csv_list(given[0]), csv_list(given[1])
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


def validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "request"
    return f"{loc}: {first['msg']}"


def add_run_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tokens, time and cost")
    g.add_argument("--tokens", type=float, help="tokens of the run, e.g. 6.4e6 or 2e12")
    g.add_argument("--target-tokens", choices=["chinchilla"], help="20 tokens per parameter")
    g.add_argument(
        "--dataset",
        help="sample lengths (.csv, .jsonl, one per line); with "
        "--tokenizer: the data itself (.jsonl, .json, .parquet, .csv)",
    )
    g.add_argument("--tokenizer", help="tokenizer.json, its folder or a Hub id: count --dataset")
    g.add_argument("--text-field", default="text", help="field holding each sample's text")
    g.add_argument("--messages-field", help="field holding each sample's chat messages")
    g.add_argument("--chat-template", help="a .jinja/tokenizer_config.json file or from-tokenizer")
    g.add_argument("--token-cache", help="cache folder (default ~/.cache/trainfit)")
    g.add_argument("--packing", action="store_true", help="pack samples into --seq rows (TRL bfd)")
    g.add_argument(
        "--packing-strategy",
        choices=["bfd", "bfd_split", "wrapped"],
        default="bfd",
        help="how --packing fills rows (TRL packing_strategy)",
    )
    g.add_argument("--epochs", type=float, default=1.0, help="passes over the data")
    g.add_argument("--truncate", action="store_true", help="truncate long samples, not drop")
    g.add_argument("--price", action="append", default=[], help="ID=USD per GPU-hour")
    g.add_argument("--calibrate", help="gpu=ID,seq=N,batch=N,tps=X (or step=X), or memtest.json")


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    from estimator.time.cost import parse_price_option
    from estimator.time.tokens import read_lengths

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
        from estimator.dataset_tokens import dataset_lengths_for  # --tokenizer / --packing

        counted = dataset_lengths_for(vars(args))
        fields["dataset_lengths"] = counted or read_lengths(args.dataset, field="--dataset")
    if args.price:
        fields["prices"] = parse_price_option(args.price)
    if args.calibrate:
        from estimator.time.calibration import parse_calibrate_option

        fields["calibration"] = _calibration_fields(parse_calibrate_option(args.calibrate), args)
    return fields


def _calibration_fields(parsed: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A memtest file becomes its first `ok` result with step times (median of the steps)."""
    if "memtest" not in parsed:
        return parsed
    from estimator.profile import load_profile
    from estimator.time.calibration import calibrate_from_memtest

    doc = read_memtest(parsed["memtest"], "--calibrate")
    first = calibrate_from_memtest(doc, load_profile(args.profile))[0]
    return {
        "gpu": first.gpu_option,
        "seq_len": first.seq_len,
        "batch": first.batch,
        "step_seconds": first.step_seconds,
    }


def gib_text(value: int) -> str:
    return f"{value / 2**30:.1f}"


def write_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def read_memtest(path_text: str, field: str) -> dict[str, Any]:
    """A memtest file, validated. A missing file names `field`; a schema error names the
    memtest's own field (`memtest.results[0].seq_len`), after `field` when that is an option."""
    from memtest_schema import MemtestSchemaError, load_memtest, validate_memtest

    path = Path(path_text)
    if not path.is_file():
        raise InputError(f"{field}: no such file {path_text!r}")
    try:
        return dict(validate_memtest(load_memtest(path.read_bytes())))
    except MemtestSchemaError as err:
        prefix = "" if field == "memtest" else f"{field}: "
        raise InputError(f"{prefix}memtest.{err.field}: {err.message}") from None


def terminal_columns() -> int:
    """`shutil.get_terminal_size().columns`, the width argparse's formatters ask for, without
    importing shutil (~3 ms with the compression modules it loads; argparse builds a formatter
    for every option it adds): COLUMNS, else the terminal of `sys.__stdout__`, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


class RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, with the width found by `terminal_columns` (argparse's rule, less 2)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = terminal_columns() - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)


class HelpFormatter(RawDescriptionFormatter):
    """Help that shows each option's default (when it has one) and keeps the example as typed."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = default not in (None, False, [], argparse.SUPPRESS)
        if action.option_strings and shown and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def add_command(sub: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    """A subcommand whose --help shows the defaults and one example."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=summary,
        formatter_class=HelpFormatter,
        epilog=f"example:\n  {example}",
    )
    return parser
