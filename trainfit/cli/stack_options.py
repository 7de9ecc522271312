"""Command-line options for the stack and its overrides (`trainfit ... --stack unsloth`); the
stacks themselves are data files in `estimator/stacks/`.

Every option defaults to None: unset, the stack's file decides (estimator.setup)."""

from __future__ import annotations

import argparse
from typing import Any, get_args

from estimator.setup_choices import (
    Base,
    Checkpointing,
    Loss,
    Objective,
    OptimizerImpl,
    StackName,
)

CHECKPOINTING = get_args(Checkpointing)
LOSSES = get_args(Loss)


def add_stack_options(g: Any) -> None:
    """Add the options to an argparse group (or parser)."""
    g.add_argument("--stack", choices=get_args(StackName), help="training framework (default hf)")
    g.add_argument(
        "--objective",
        choices=get_args(Objective),
        help="sft (default); dpo: TRL's DPOTrainer, --batch counts preference pairs (a chosen "
        "and a rejected sequence each) and each step runs a reference forward (--loss "
        "chunked: TRL 1.16's fused head; --loss full: TRL 1.0-1.9, axolotl's pin); "
        "dpo-precomputed: the reference log-probabilities computed before training; kto: TRL "
        "1.0-1.9's KTOTrainer, --batch counts labelled completions (at least 2); orpo, "
        "cpo, simpo: TRL 1.0-1.9's ORPOTrainer, CPOTrainer, CPOTrainer with cpo_alpha 0 "
        "(pairs as dpo, no reference, --loss full)",
    )
    g.add_argument(
        "--autocast", action=argparse.BooleanOptionalAction, default=None, help="torch.autocast"
    )
    g.add_argument("--optimizer-impl", choices=get_args(OptimizerImpl))
    g.add_argument("--paged", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--lora-dropout", type=float, help="peft lora_dropout (0 <= p < 1)")
    g.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    g.add_argument(
        "--eval-batch",
        type=int,
        help="rows per device of an evaluation pass between steps, at the training length "
        "(per_device_eval_batch_size); priced as a moment of its own",
    )
    g.add_argument(
        "--eval-skip-logits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the evaluation's Liger loss skips the logits too (TRL's SFTTrainer does)",
    )
    g.add_argument(
        "--no-eval",
        action="store_true",
        help="price no evaluation pass, not even the one a --train-config runs",
    )
    g.add_argument("--double-quant", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--train-embeddings", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--kbit-prepare", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile of each decoder layer (inductor's saved activations)",
    )
    g.add_argument("--base", choices=get_args(Base), help="base weights: bf16, int8 (LLM.int8)")
    g.add_argument(
        "--liger-kernels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Liger's RMSNorm, SwiGLU and RoPE kernels (transformers' use_liger_kernel)",
    )
    g.add_argument(
        "--quantize-experts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="QLoRA: the MoE expert banks in NF4 too (axolotl's quantize_moe_experts)",
    )


def stack_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The options the user gave, as TrainingSetup fields."""
    names = (
        "stack",
        "objective",
        "autocast",
        "optimizer_impl",
        "paged",
        "lora_dropout",
        "grad_accum",
        "eval_batch",
        "eval_skip_logits",
        "double_quant",
        "train_embeddings",
        "kbit_prepare",
        "base",
        "compile",
        "loss_chunk",
        "liger_kernels",
        "quantize_experts",
    )
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    if getattr(args, "no_eval", False):
        given.pop("eval_batch", None)
        given.pop("eval_skip_logits", None)
    return given
