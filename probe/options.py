"""The training setup as the probe takes it: the estimator's `TrainingSetup` fields, mirrored.

The probe must run on a GPU box without pydantic, so it does not import `estimator`; the names
and choices below are kept identical to `estimator/setup.py` (a test compares them). The memtest
`setup` object is `normalize_setup(...)` output: a plain dict with exactly these keys.
"""

from __future__ import annotations

from typing import Any

from memtest_schema import MAX_BATCH, SETUP_CHOICES, STACK_SETUP_FIELDS

__all__ = [
    "DEFAULT_SETUP",
    "STACK_DEFAULTS",
    "SETUP_CHOICES",
    "ProbeInputError",
    "normalize_setup",
    "parse_sweep",
]

MAX_GPUS = 100_000
MAX_SEQ = 10_000_000

DEFAULT_SETUP: dict[str, Any] = {
    "method": "full",
    "lora_rank": 16,
    "lora_alpha": None,
    "lora_targets": ["all-linear"],
    "adapter_dtype": "fp32",
    "optimizer": "adamw",
    "precision": "mixed",
    "checkpointing": "gpu",
    "loss": "full",
    "loss_chunk": 4096,
    "batch": 1,
    "sharding": "none",
    "num_gpus": 1,
    "attention": "sdpa",
}


# The stack fields (memtest_schema.STACK_SETUP_FIELDS). None = the stack's own default, resolved
# by `normalize_setup`: hf autocasts unless precision is fp32 (TrainingArguments bf16=True) and
# uses fused AdamW (transformers' default `optim` for torch >= 2.8, training_args.py); the probe's
# own loop has no autocast and steps AdamW on the foreach path.
STACK_DEFAULTS: dict[str, Any] = {
    "stack": "probe",
    "autocast": None,
    "optimizer_impl": None,
    "paged": False,
    "lora_dropout": 0.0,
    "grad_accum": 1,
    "double_quant": False,
    "eval_batch": None,  # rows of an evaluation pass after each length's steps (--stack hf)
    "objective": "sft",  # dpo / orpo / simpo: TRL's trainers (--stack hf, probe.trl_stack)
}
assert set(STACK_DEFAULTS) <= set(STACK_SETUP_FIELDS)


class ProbeInputError(ValueError):
    """Bad input to the probe (config, setup, sweep); `field` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _int_field(value: object, field: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProbeInputError(field, f"expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ProbeInputError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def normalize_setup(setup: dict[str, Any] | None) -> dict[str, Any]:
    """Fill defaults and check every field; returns a new dict with exactly the setup keys."""
    given = dict(setup or {})
    unknown = sorted(set(given) - set(DEFAULT_SETUP) - set(STACK_DEFAULTS))
    if unknown:
        raise ProbeInputError(f"setup.{unknown[0]}", "unknown setup field")
    defaults = {**DEFAULT_SETUP, **STACK_DEFAULTS, **_stack_setup_defaults(given)}
    out = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    for key, choices in SETUP_CHOICES.items():
        if choices is not None and out[key] not in choices:
            raise ProbeInputError(
                f"setup.{key}", f"must be one of {', '.join(choices)}; got {out[key]!r}"
            )
    out["lora_rank"] = _int_field(out["lora_rank"], "setup.lora_rank", 1, 65536)
    out["loss_chunk"] = _int_field(out["loss_chunk"], "setup.loss_chunk", 1, 10**9)
    out["batch"] = _int_field(out["batch"], "setup.batch", 1, MAX_BATCH)
    out["num_gpus"] = _int_field(out["num_gpus"], "setup.num_gpus", 1, MAX_GPUS)
    alpha = out["lora_alpha"]
    if alpha is not None:
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ProbeInputError("setup.lora_alpha", f"expected a positive number, got {alpha!r}")
        out["lora_alpha"] = float(alpha)
    targets = out["lora_targets"]
    if isinstance(targets, str):
        targets = targets.split(",")
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ProbeInputError("setup.lora_targets", "expected a list of module names")
    cleaned = [t.strip() for t in targets if t.strip()]
    if not cleaned:
        raise ProbeInputError(
            "setup.lora_targets", "give at least one target module name, or 'all-linear'"
        )
    out["lora_targets"] = cleaned
    if out["sharding"] == "none" and out["num_gpus"] > 1:
        out["sharding"] = "device_map"  # as the estimator's TrainingSetup does
    _normalize_stack_fields(out)
    return out


def _stack_setup_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """Setup defaults that depend on the stack. torchtune trains in `dtype` with no AMP and no
    masters, its LoRA adapters in the model's dtype (recipes/lora_finetune_single_device.py
    validate_expected_param_dtype): precision bf16, adapter_dtype = the model's dtype."""
    if given.get("stack") != "torchtune":
        return {}
    precision = given.get("precision") or "bf16"
    return {"precision": precision, "adapter_dtype": "fp32" if precision == "fp32" else "bf16"}


def _bool_field(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise ProbeInputError(field, f"expected true or false, got {value!r}")
    return value


def _normalize_stack_fields(out: dict[str, Any]) -> None:
    """Check the stack fields and resolve the stack-dependent defaults (in place)."""
    for key, choices in STACK_SETUP_FIELDS.items():
        if choices is not None and out.get(key) is not None and out[key] not in choices:
            raise ProbeInputError(
                f"setup.{key}", f"must be one of {', '.join(choices)}; got {out[key]!r}"
            )
    for key in ("paged", "double_quant"):
        out[key] = _bool_field(out[key], f"setup.{key}")
    out["grad_accum"] = _int_field(out["grad_accum"], "setup.grad_accum", 1, 100_000)
    if out["eval_batch"] is not None:
        out["eval_batch"] = _int_field(out["eval_batch"], "setup.eval_batch", 1, MAX_BATCH)
    dropout = out["lora_dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise ProbeInputError("setup.lora_dropout", f"expected a number in [0, 1), got {dropout!r}")
    out["lora_dropout"] = float(dropout)
    hf = out["stack"] != "probe"
    if out["autocast"] is None:  # torchtune's recipes have no autocast
        out["autocast"] = out["stack"] not in ("probe", "torchtune") and out["precision"] != "fp32"
    out["autocast"] = _bool_field(out["autocast"], "setup.autocast")
    if out["optimizer_impl"] is None:
        out["optimizer_impl"] = "fused" if hf and out["optimizer"] == "adamw" else "foreach"
    if out["stack"] == "hf" and out["method"] == "qlora":
        # the hf stack's QLoRA runs peft's prepare_model_for_kbit_training (probe.hf_stack):
        # say so in the memtest, so the estimator compares with the same preparation
        out["kbit_prepare"] = True
    if out["stack"] == "hf" and out["method"] == "qlora" and out["loss"] == "chunked":
        # TRL's SFTTrainer (probe.trl_stack) casts a quantized model's trainable parameters to
        # bf16 (trl 1.16.0 trl/trainer/sft_trainer.py:908-911): record what ran
        out["adapter_dtype"] = "bf16"
    if out["objective"] != "sft":
        # probe.trl_stack's chosen and rejected completions are the same length: the collator
        # pads neither, so the rows carry no padding (the estimator's dpo default pads)
        out["padded_batches"] = False
    if out["stack"] == "hf" and out["loss"] == "liger":
        # TrainingArguments use_liger_kernel=True (probe.hf_stack) applies Liger's RMSNorm,
        # SwiGLU and RoPE with the loss: say so, as kbit_prepare above
        out["liger_kernels"] = True
    if out["stack"] == "torchtune" and out["method"] == "qlora":
        # torchtune's QLoRA base is torchao's NF4Tensor, whose per-block scalers are always
        # quantized to int8 (double quant; torchtune modules/peft/lora.py to_nf4), and nothing
        # upcasts norms or embeddings (no kbit preparation)
        out["double_quant"] = True
        out["kbit_prepare"] = False


def parse_sweep(value: str | list[int]) -> list[int]:
    """`"16000,32000"` or a list -> distinct positive sequence lengths, in the given order."""
    items: list[object]
    if isinstance(value, str):
        items = [s.strip() for s in value.split(",") if s.strip()]
    else:
        items = list(value)
    if not items:
        raise ProbeInputError("sweep", "give at least one sequence length")
    out: list[int] = []
    for i, item in enumerate(items):
        try:
            seq = int(item) if isinstance(item, str) else item
        except ValueError:
            raise ProbeInputError(f"sweep[{i}]", f"not an integer: {item!r}") from None
        out.append(_int_field(seq, f"sweep[{i}]", 1, MAX_SEQ))
    if len(set(out)) != len(out):
        raise ProbeInputError("sweep", "sequence lengths must be distinct")
    if len(out) > 1000:
        raise ProbeInputError("sweep", "at most 1000 lengths")
    return out
