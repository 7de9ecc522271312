"""Every stack option refuses bad input: exit code 2 naming the field (CLI), a validation error
naming it (REST body -> 422), never a traceback."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from estimator.request import EstimateRequest
from trainfit.cli import main

BASE = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200"]

CLI_CASES = [
    ("unknown stack", ["--stack", "megatron"], "--stack"),
    ("unknown optimizer impl", ["--optimizer-impl", "turbo"], "--optimizer-impl"),
    ("dropout of 1", ["--method", "lora", "--lora-dropout", "1"], "lora_dropout"),
    ("negative dropout", ["--method", "lora", "--lora-dropout", "-0.1"], "lora_dropout"),
    ("dropout not a number", ["--lora-dropout", "some"], "--lora-dropout"),
    ("zero lora alpha", ["--method", "lora", "--lora-alpha", "0"], "lora_alpha"),
    ("zero grad accum", ["--grad-accum", "0"], "grad_accum"),
    ("grad accum not an int", ["--grad-accum", "2.5"], "--grad-accum"),
    ("unknown loss", ["--loss", "focal"], "--loss"),
    ("zero loss chunk", ["--loss", "chunked", "--loss-chunk", "0"], "loss_chunk"),
    ("unknown checkpointing", ["--checkpointing", "disk"], "--checkpointing"),
    ("selective outside torchtitan", ["--checkpointing", "selective"], "checkpointing"),
    ("unknown base", ["--method", "lora", "--base", "fp8"], "--base"),
    ("int8 base for full", ["--base", "int8"], "base"),
    ("qlora with int8 base", ["--method", "qlora", "--base", "int8"], "base"),
    ("paged sgd", ["--optimizer", "sgd", "--paged"], "paged"),
    ("paged 4-bit adamw", ["--optimizer", "adamw-4bit", "--paged"], "paged"),
    ("unknown optimizer", ["--optimizer", "adamw-2bit"], "--optimizer"),
    (
        "in-backward with accumulation",
        ["--optimizer-impl", "in-backward", "--grad-accum", "4"],
        "optimizer_impl",
    ),
    ("autocast with a value", ["--autocast=yes"], "--autocast"),
    ("double quant with a value", ["--double-quant=1"], "--double-quant"),
    ("train embeddings with a value", ["--train-embeddings=maybe"], "--train-embeddings"),
    ("kbit prepare with a value", ["--kbit-prepare=sure"], "--kbit-prepare"),
    ("paged with a value", ["--paged=on"], "--paged"),
    ("compile with a value", ["--compile=fast"], "--compile"),
    ("liger kernels with a value", ["--liger-kernels=all"], "--liger-kernels"),
    ("liger kernels under unsloth", ["--stack", "unsloth", "--liger-kernels"], "liger_kernels"),
    ("xformers outside unsloth", ["--attention", "xformers"], "attention"),
    ("unknown attention", ["--attention", "paged"], "--attention"),
    (
        "liger kernels for a model liger does not patch",
        ["--liger-kernels", "--model", "gpt2"],
        "liger_kernels",
    ),
    ("unknown objective", ["--objective", "ppo"], "--objective"),
    ("dpo outside TRL", ["--objective", "dpo", "--stack", "unsloth"], "objective"),
    ("dpo with liger's loss", ["--objective", "dpo", "--loss", "liger"], "loss"),
    ("dpo with an evaluation pass", ["--objective", "dpo", "--eval-batch", "4"], "eval_batch"),
    (
        "dpo under tensor parallelism",
        ["--objective", "dpo", "--parallel", "fsdp=4,tp=2", "--gpu", "8xh100"],
        "parallel",
    ),
    (
        "fsdp wrap of an unknown module",
        ["--method", "full", "--parallel", "fsdp", "--gpu", "8xh100", "--fsdp-wrap", "layer+norm"],
        "fsdp_wrap",
    ),
    (
        "fsdp wrap given twice",
        ["--parallel", "fsdp", "--gpu", "8xh100", "--fsdp-wrap", "layer+output+lm_head"],
        "fsdp_wrap",
    ),
]


def _exit_code(argv: list[str]) -> int:
    """main() returns 2 for values the setup rejects; argparse itself exits 2 for choices,
    types and flag values (usage and the option's name on stderr)."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.mark.parametrize("name,args,field", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_stack_option_exits_2_naming_the_field(capsys, name, args, field) -> None:
    assert _exit_code([*BASE, *args]) == 2
    err = capsys.readouterr().err
    assert field in err, err
    assert "Traceback" not in err


REST_CASES = [
    ({"stack": "megatron"}, "stack"),
    ({"optimizer_impl": "turbo"}, "optimizer_impl"),
    ({"lora_dropout": 1.0}, "lora_dropout"),
    ({"grad_accum": 0}, "grad_accum"),
    ({"loss": "focal"}, "loss"),
    ({"loss_chunk": 0}, "loss_chunk"),
    ({"checkpointing": "selective", "stack": "hf"}, "checkpointing"),
    ({"base": "int8"}, "base"),
    ({"paged": True, "optimizer": "adafactor"}, "paged"),
    ({"paged": True, "optimizer": "adamw-4bit"}, "paged"),
    ({"autocast": "sometimes"}, "autocast"),
    ({"double_quant": "yes please"}, "double_quant"),
    ({"train_embeddings": 3}, "train_embeddings"),
    ({"kbit_prepare": "maybe"}, "kbit_prepare"),
    ({"lora_alpha": -1}, "lora_alpha"),
    ({"compile": "inductor"}, "compile"),
    ({"liger_kernels": "all"}, "liger_kernels"),
    ({"liger_kernels": True, "stack": "torchtune"}, "liger_kernels"),
    ({"attention": "xformers", "stack": "hf"}, "attention"),
    ({"attention": "cutlass"}, "attention"),
    ({"optimizer_impl": "in-backward", "grad_accum": 2}, "optimizer_impl"),
    ({"fsdp_wrap": "layer+norm", "parallel": "fsdp", "num_gpus": 8}, "fsdp_wrap"),
    ({"objective": "ppo"}, "objective"),
    ({"objective": "dpo", "stack": "torchtune"}, "objective"),
    ({"objective": "dpo", "loss": "cce"}, "loss"),
    ({"objective": "dpo", "eval_batch": 2}, "eval_batch"),
]


@pytest.mark.parametrize("setup,field", REST_CASES, ids=[f for _, f in REST_CASES])
def test_bad_stack_field_in_a_request_names_the_field(setup, field) -> None:
    with pytest.raises(ValidationError) as info:
        EstimateRequest.model_validate({"model": {"preset": "llama-3.1-8b"}, "setup": setup})
    first = info.value.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) + " " + first["msg"]
    assert field in where, where
