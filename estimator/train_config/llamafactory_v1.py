"""LLaMA-Factory's v1 YAML (`llamafactory-cli` v1 / `python -m llamafactory.v1.trainers.sft_trainer
config.yaml`): `model`, `peft_config`, `quant_config`, `kernel_config`, `dist_config`,
`micro_batch_size`, `cutoff_len`. Its own training loop, not the HF Trainer of the v0 format
(`llamafactory.py`), so its defaults differ and are read here.

Read from LLaMA-Factory ff6d4d12 (2026-08-18), `src/llamafactory/v1/`:
- `config/model_args.py`: `model` (24-25, default `Qwen/Qwen3-4B-Instruct-2507`), `flash_attn`
  (default sdpa), `model_class`, `peft_config`, `kernel_config`, `quant_config` (46-59).
- `config/training_args.py`: `micro_batch_size` (33, default 1), `global_batch_size` (37,
  default dp x micro: one micro-batch per step, core/utils/batching.py:184-190), `cutoff_len`
  (41, default 2048), `bf16` (61, default True), `batching_strategy` (65),
  `enable_activation_checkpointing` (73, default True), `dist_config` (77), `cp_size` (85),
  `mp_replicate_size` (93), `optim_config` (105).
- `core/model_engine.py`: the model loads with `dtype="auto"` (191); full tuning (no
  `peft_config`) casts it to fp32 (207); kernels are applied with `require_logits` at training
  (225).
- `core/base_trainer.py`: HF gradient checkpointing, non-reentrant (92); the default optimizer
  is `torch.optim.AdamW(params, lr)` (209), torch's foreach path on CUDA (torch 2.13
  torch/optim/optimizer.py `_default_to_fused_or_foreach`); no torch.autocast anywhere in v1:
  without FSDP2 the model computes in the dtype it holds; the loss (240-243) is
  `logits.float()`, a contiguous copy of the shifted fp32 logits, then `F.cross_entropy`;
  gradients accumulate in `.grad` over the micro-batches (290) until `zero_grad` (322).
- `plugins/model_plugins/peft.py`: LoRA `r` 8, `lora_alpha` 16, `lora_dropout` 0.05,
  `target_modules` `all` (38-44: every Linear but lm_head/output/score/classifier, 87-89),
  `use_dora` (48), `modules_to_save` (50), `adapter_name_or_path` (52: training resumes that
  adapter with its own hyperparameters); `freeze` tuning.
- `plugins/model_plugins/quantization.py`: `name` bnb | auto (40), `quantization_bit` (41; bnb
  without it quantizes to 4 bits, 90; auto without it quantizes nothing, 66),
  `double_quantization` (43, default True), `quantization_type` (44), 8 bits = LLM.int8 (97).
- `plugins/trainer_plugins/distributed/fsdp2.py`: `reshard_after_forward` (188, default True),
  `offload_params` (189), the MixedPrecisionPolicy (206-216: bf16 compute copies of the fp32
  parameters when `bf16`, else fp32); `deepspeed.py`: `dist_config.config_file` (58), a DeepSpeed
  JSON; `fsdpturbo` (not modelled).
- `plugins/model_plugins/kernels/interface.py`: `kernel_config.name` is comma-separated kernel
  names; `auto` applies NPU kernels only (31-32): none on CUDA; `liger_kernel_ops.py`: Liger's
  patch for the Qwen3 family only (33-41), its fused linear cross-entropy off at training (134).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.train_config.result import TrainConfigMapping, whole_number
from estimator.train_config.sharding import set_layout, set_offload
from estimator.train_config.vocab import (
    lora_targets,
    map_attention,
    trains_embeddings,
    with_revision,
)

FORMAT = "llamafactory-v1"
# keys of v1's argument dataclasses: beside `model:` (v0 names it model_name_or_path) they mark
# a v1 file
V1_KEYS = (
    "cutoff_len",
    "micro_batch_size",
    "global_batch_size",
    "peft_config",
    "quant_config",
    "kernel_config",
    "dist_config",
    "model_class",
    "enable_activation_checkpointing",
    "batching_strategy",
    "init_config",
    "optim_config",
    "train_dataset",
)
DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"  # config/model_args.py:24-25
# liger_kernel_ops.py:33-41: the model types LLaMA-Factory v1 patches with Liger
LIGER_MODEL_TYPES = (
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
)
SHIFTED_LOSS = (
    "LLaMA-Factory v1's loss (core/base_trainer.py:240-243) also keeps a contiguous fp32 copy of "
    "the shifted logits beside their fp32 upcast and the model's bf16 logits: 14 bytes per logit "
    "at the loss's forward where the transformers loss trainfit counts (`full`) has 10 and its "
    "backward 12, so the loss moment is up to tokens x vocab x 2 bytes over what is estimated"
)


def is_v1(data: dict[str, Any]) -> bool:
    """A v1 config: `model` is a name (torchtune's is a mapping) and a v1-only key is present."""
    return isinstance(data.get("model"), str) and any(k in data for k in V1_KEYS)


def read_llamafactory_v1(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    m = TrainConfigMapping(FORMAT)
    name = m.get(data, "model")
    m.model = with_revision(str(name or DEFAULT_MODEL), None, base_dir)
    m.origin["model"] = "model" if name else f"model (default {DEFAULT_MODEL})"
    m.set("stack", "hf", "(LLaMA-Factory v1: transformers model, its own training loop)")
    _batch(m, data)
    _model_class(m, data)
    map_attention(m, m.get(data, "flash_attn"), "flash_attn")
    adapter = _peft(m, m.get(data, "peft_config"))
    _quantization(m, m.get(data, "quant_config"), adapter)
    sharded = _dist(m, m.get(data, "dist_config"))
    _precision(m, data, adapter, sharded)
    checkpointing = m.get(data, "enable_activation_checkpointing")
    on = True if checkpointing is None else bool(checkpointing)
    key = "enable_activation_checkpointing" + (" (default True)" * (checkpointing is None))
    m.set("checkpointing", "gpu" if on else "none", key)
    _optimizer(m, m.get(data, "optim_config"))
    m.set("loss", "full", "(core/base_trainer.py:240-243: cross-entropy over every logit)")
    m.ignore("loss", SHIFTED_LOSS)
    _kernels(m, m.get(data, "kernel_config"))
    _parallel_sizes(m, data)
    for key in ("batching_strategy", "init_config", "train_dataset", "lr_scheduler_config"):
        m.get(data, key)  # sequences up to cutoff_len either way; loading; data; the schedule
    m.warn_unread(data)
    return m


def _batch(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    length = m.get(data, "cutoff_len")
    m.seq_lens = [whole_number(length, "cutoff_len") if length is not None else 2048]
    m.origin["seq_lens"] = "cutoff_len" if length is not None else "cutoff_len (default 2048)"
    micro = m.get(data, "micro_batch_size")
    micro = 1 if micro is None else whole_number(micro, "micro_batch_size")
    m.set("batch", micro, "micro_batch_size" if "micro_batch_size" in data else "(default 1)")
    total = m.get(data, "global_batch_size")
    if total is not None:
        total = whole_number(total, "global_batch_size")
        if total == micro:
            m.set("grad_accum", 1, "global_batch_size")
        else:
            m.warnings.append(
                f"global_batch_size: {total} makes global_batch_size / (data-parallel GPUs x "
                f"micro_batch_size {micro}) micro-batches per step (core/utils/batching.py:"
                "184-190); the GPU count is not in this file: pass --grad-accum with that number"
            )


def _model_class(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    kind = m.get(data, "model_class")
    if kind not in (None, "llm"):
        m.ignore("model_class", f"model_class {kind!r}: counted as a causal LM with its lm_head")


def _peft(m: TrainConfigMapping, peft: object) -> bool:
    """The `peft_config` plugin; True when it trains a LoRA adapter."""
    if peft is None:
        m.set("method", "full", "peft_config (none: full tuning)")
        return False
    if not isinstance(peft, dict):
        m.ignore("peft_config", f"expected a mapping with a name, got {peft!r}")
        return False
    kind = m.get(peft, "name", "peft_config.")
    if kind != "lora":
        m.ignore("peft_config.name", f"{kind!r} tuning is not modelled (lora is)")
        m.warn_unread(peft, "peft_config.")
        return False
    m.set("method", "lora", "peft_config.name")
    p = "peft_config."
    for field, key, default in (
        ("lora_rank", "r", 8),
        ("lora_alpha", "lora_alpha", 16),
        ("lora_dropout", "lora_dropout", 0.05),
    ):
        value = m.get(peft, key, p)
        if field == "lora_rank" and value is not None:
            value = whole_number(value, p + key)
        m.set(field, default if value is None else value, p + key + " (default)" * (value is None))
    targets = m.get(peft, "target_modules", p)
    m.set("lora_targets", lora_targets("all" if targets is None else targets), p + "target_modules")
    saved = trains_embeddings(m.get(peft, "modules_to_save", p))
    m.set("train_embeddings", saved, p + "modules_to_save")
    if m.get(peft, "use_dora", p):
        m.ignore(p + "use_dora", "DoRA's extra magnitude vectors and activations are not modelled")
    if m.get(peft, "adapter_name_or_path", p):
        m.warnings.append(
            f"{p}adapter_name_or_path: training resumes that adapter with its own r and targets "
            "(plugins/model_plugins/peft.py load_adapter), not this file's: pass its "
            "adapter_config.json with --adapter-config"
        )
    for key in ("use_rslora", "export_dir", "export_size", "export_hub_model_id", "infer_dtype"):
        m.get(peft, key, p)  # scaling, export and inference only
    m.warn_unread(peft, p)
    return True


def _quantization(m: TrainConfigMapping, quant: object, adapter: bool) -> None:
    if not isinstance(quant, dict):
        return
    p = "quant_config."
    kind = m.get(quant, "name", p) or "bnb"
    bits = m.get(quant, "quantization_bit", p)
    if kind not in ("bnb", "auto"):
        m.ignore(p + "name", f"{kind!r} quantization is not modelled (bnb is)")
        return
    if bits is None:
        bits = 4 if kind == "bnb" else None  # quantization.py:90 and :66
    if bits is None:
        return
    if bits not in (4, 8):
        m.ignore(p + "quantization_bit", f"{bits}-bit quantization is not modelled (4/8 are)")
        return
    if not adapter:
        m.ignore(p + "quantization_bit", "a quantized base trains only with a LoRA peft_config")
        return
    key = p + "quantization_bit" + (" (default 4)" * ("quantization_bit" not in quant))
    # v1's LoRA plugin calls get_peft_model only, never peft's prepare_model_for_kbit_training
    m.set("kbit_prepare", False, "peft_config (plugins/model_plugins/peft.py get_lora_model)")
    if bits == 4:
        m.set("method", "qlora", key)
        double = m.get(quant, "double_quantization", p)
        m.set("double_quant", True if double is None else bool(double), p + "double_quantization")
    else:
        m.set("base", "int8", key)
    for name in ("quantization_type", "compute_dtype"):
        m.get(quant, name, p)  # nf4 and fp4 take the same bytes; a 2-byte compute dtype either way
    m.warn_unread(quant, p)


def _dist(m: TrainConfigMapping, dist: object) -> str | None:
    """The `dist_config` plugin's name when it shards (fsdp2, deepspeed), else None."""
    if not isinstance(dist, dict):
        return None
    p = "dist_config."
    kind = m.get(dist, "name", p)
    if kind == "fsdp2":
        reshard = m.get(dist, "reshard_after_forward", p)
        set_layout(m, "fsdp", "fsdp", p + "name", reshard=reshard is not False)
        if m.get(dist, "offload_params", p):
            set_offload(m, "params", p + "offload_params")
        for key in ("pin_memory", "dcp_path"):
            m.get(dist, key, p)
    elif kind == "deepspeed":
        m.set("stack", "deepspeed", p + "name")
        m.get(dist, "config_file", p)  # followed by load.map_config (its ZeRO settings)
    else:
        m.ignore(p + "name", f"{kind!r} is not modelled (fsdp2, deepspeed are)")
    m.warn_unread(dist, p)
    return str(kind) if kind in ("fsdp2", "deepspeed") else None


def _precision(
    m: TrainConfigMapping, data: dict[str, Any], adapter: bool, sharded: str | None
) -> None:
    bf16 = m.get(data, "bf16")
    bf16 = True if bf16 is None else bool(bf16)
    key = "bf16" if "bf16" in data else "bf16 (default True)"
    if sharded == "deepspeed":
        return  # the DeepSpeed JSON's bf16 decides (its engine casts; sharding.map_deepspeed)
    fsdp_bf16 = sharded == "fsdp2" and bf16
    if adapter:
        # the base in its checkpoint dtype (dtype="auto"), peft's fp32 adapters; FSDP2's bf16
        # policy computes the adapters in bf16 too, without it their inputs are cast to fp32
        m.set("autocast", fsdp_bf16, f"{key} + dist_config.name (fsdp2.py:206-216)")
        return
    # full tuning: fp32 weights (model_engine.py:207), bf16 compute copies only under FSDP2
    m.set("precision", "mixed" if fsdp_bf16 else "fp32", f"{key} + dist_config (fsdp2.py:206-216)")
    m.set("autocast", False, "(no torch.autocast in LLaMA-Factory v1)")


def _optimizer(m: TrainConfigMapping, optim: object) -> None:
    if isinstance(optim, dict) and m.get(optim, "name", "optim_config.") is not None:
        m.ignore("optim_config.name", f"optimizer {optim.get('name')!r} is not modelled")
        return
    m.set("optimizer", "adamw", "optim_config (none: torch.optim.AdamW, base_trainer.py:209)")
    m.set("optimizer_impl", "foreach", "optim_config (none: torch's default foreach AdamW)")


def _kernels(m: TrainConfigMapping, kernels: object) -> None:
    if not isinstance(kernels, dict):
        return
    names = str(m.get(kernels, "name", "kernel_config.") or "").split(",")
    names = [n.strip() for n in names if n.strip()]
    if "liger_kernel" in names:
        m.set("liger_kernels", True, "kernel_config.name")
        m.warnings.append(
            "kernel_config.name: LLaMA-Factory v1 patches Liger into the Qwen3 family only ("
            + ", ".join(LIGER_MODEL_TYPES)
            + "; liger_kernel_ops.py:33-41); for another model type it applies none: pass "
            "--no-liger-kernels"
        )
    for other in names:
        if other not in ("auto", "liger_kernel"):
            m.ignore("kernel_config.name", f"kernel {other!r} is not modelled")
    for key in ("use_kernels", "require_logits"):
        m.get(kernels, key, "kernel_config.")
    m.warn_unread(kernels, "kernel_config.")


def _parallel_sizes(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    for key, what in (
        ("cp_size", "Ulysses context parallelism"),
        ("mp_replicate_size", "replicated FSDP2 groups (HSDP)"),
    ):
        value = m.get(data, key)
        if value not in (None, 1):
            m.ignore(key, f"{what} ({key} {value}) is not modelled")
    for key in ("dp_size", "mp_shard_size"):
        m.get(data, key)  # the FSDP2 mesh spans every GPU by default; the GPU count is an option
