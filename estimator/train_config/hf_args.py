"""HF `TrainingArguments` / TRL `SFTConfig` (+ TRL's `ModelConfig` keys in the same YAML).

Option names and defaults read from:
- transformers 5.24.0 `training_args.py`: `per_device_train_batch_size`,
  `gradient_accumulation_steps`, `optim` (default `adamw_torch_fused` on torch >= 2.8, lines
  806-811), `bf16`/`fp16` (lines 874-885: AMP, i.e. autocast), `gradient_checkpointing` and
  its v5 alias `activation_checkpointing` (lines 908-926), `use_liger_kernel` and
  `liger_kernel_config` (957), `fsdp` (1447, words such as "full_shard auto_wrap offload"),
  `fsdp_config`, `deepspeed` (1463, a path or a dict), `torch_compile`, `num_train_epochs`.
- trl f2cd5771 (2026-07-24) `trl/trainer/sft_config.py`: `max_length` (default 1024, line 205),
  `packing` (225), `packing_strategy` (232, default `bfd`), `padding_free` (241), `loss_type`
  (trl 1.16.0 sft_config.py:283-289: `nll` by default, `dft`, and `chunked_nll` its deprecated
  alias; every one runs TRL's fused LM head, sft_trainer.py:1611, the hf stack's `chunked`
  loss, but `nll` with `label_smoothing_factor` > 0, whose label smoother takes the model's
  full logits, sft_trainer.py:1601-1607),
  `activation_offloading` (296), `model_init_kwargs` (149); class docstring: SFTConfig defaults
  `gradient_checkpointing=True` and `bf16=True` unless `fp16`. Older TRL: `max_seq_length`.
- trl `trl/trainer/model_config.py`: `model_name_or_path`, `dtype`, `attn_implementation`,
  `use_peft`, `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`,
  `lora_modules_to_save`, `use_dora`, `load_in_8bit`, `load_in_4bit`, `use_bnb_nested_quant`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.lora import PEFT_DEFAULT
from estimator.objective import PREFERENCE
from estimator.train_config.evaluation import set_eval_batch
from estimator.train_config.result import TrainConfigMapping, whole_number
from estimator.train_config.sharding import map_fsdp_dict, map_fsdp_words
from estimator.train_config.trl_dpo import is_dpo_config, map_dpo
from estimator.train_config.trl_preference import map_preference, preference_trainer
from estimator.train_config.vocab import (
    HF_OPTIMIZERS,
    lora_targets,
    map_attention,
    set_trainer_loss,
    trains_embeddings,
    with_revision,
)

TRL_KEYS = (
    "max_length",
    "max_seq_length",
    "packing",
    "packing_strategy",
    "padding_free",
    "dataset_text_field",
    "completion_only_loss",
    "assistant_only_loss",
    "loss_type",
    "activation_offloading",
    "model_init_kwargs",
)
# trl/trainer/model_config.py defaults: lora_r 16, lora_alpha 32, lora_dropout 0.05
TRL_LORA_DEFAULTS = (
    ("lora_rank", "lora_r", 16),
    ("lora_alpha", "lora_alpha", 32),
    ("lora_dropout", "lora_dropout", 0.05),
)
# TrainingArguments' per_device_train_batch_size / per_device_eval_batch_size default
# (transformers 5.25.0 training_args.py:777, 1128); trl's SFTConfig does not change them
# (trl f2cd5771 sft_config.py:132-137 lists the defaults it changes)
HF_DEFAULT_BATCH = 8
HF_DEFAULT_OPTIM = "adamw_torch_fused"  # transformers 5.24.0 training_args.py:806-811, torch>=2.8
# TrainingArguments keys whose names look memory-related but that do not change the training
# step's GPU memory: evaluation, host-side data loading, logging, checkpoint files, the options
# of torch_compile (mapped to `compile`). Read so that a full `TrainingArguments.to_dict()`
# dump gives no false warnings.
NO_TRAIN_MEMORY = (
    "eval_do_concat_batches",
    "eval_accumulation_steps",
    "bf16_full_eval",
    "fp16_full_eval",
    "batch_eval_metrics",
    "prediction_loss_only",
    "dataloader_pin_memory",
    "length_column_name",
    "skip_memory_metrics",
    "enable_jit_checkpoint",
    "restore_callback_states_from_checkpoint",
    "resume_from_checkpoint",
    "torch_compile_backend",
    "torch_compile_mode",
    "optim_args",
    "half_precision_backend",
)


def is_sft_config(data: dict[str, Any]) -> bool:
    return any(k in data for k in TRL_KEYS)


def map_trainer_args(m: TrainConfigMapping, data: dict[str, Any], sft: bool) -> None:
    """The TrainingArguments keys (shared by TRL and LLaMA-Factory configs)."""
    m.set("stack", "hf", "(transformers Trainer)")
    _batches(m, data)
    m.set("grad_accum", m.get(data, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    m.set_run("epochs", m.get(data, "num_train_epochs"), "num_train_epochs")
    map_optim(m, m.get(data, "optim"), "optim")
    bf16, fp16 = m.get(data, "bf16"), m.get(data, "fp16")
    if sft and bf16 is None and not fp16:
        bf16 = True  # SFTConfig default (sft_config.py docstring)
    if bf16 or fp16:
        m.set("autocast", True, "bf16" if bf16 else "fp16")
        m.set("precision", "mixed", "bf16" if bf16 else "fp16")
    elif bf16 is False or fp16 is False:
        m.warnings.append(
            "bf16/fp16: both off, so the model trains in the dtype it was loaded in, which this "
            "file does not say; trainfit keeps --precision"
        )
    for key in NO_TRAIN_MEMORY:
        m.get(data, key)
    gc = m.get(data, "gradient_checkpointing")
    ac = m.get(data, "activation_checkpointing")
    if gc is None and ac is None and sft:
        gc = True  # SFTConfig default (sft_config.py docstring)
    if gc is not None or ac is not None:
        key = "gradient_checkpointing" if gc is not None else "activation_checkpointing"
        m.set("checkpointing", "gpu" if (gc or ac) else "none", key)
    m.get(data, "gradient_checkpointing_kwargs")
    m.get(data, "activation_checkpointing_kwargs")
    if m.get(data, "activation_offloading"):
        m.set("checkpointing", "offload", "activation_offloading")
    _map_liger(m, data)
    compiled = m.get(data, "torch_compile")
    if compiled is not None:
        m.set("compile", bool(compiled), "torch_compile")
    if m.get(data, "auto_find_batch_size"):
        m.ignore("auto_find_batch_size", "the batch is searched at run time; trainfit uses batch")
    fsdp = m.get(data, "fsdp")
    if fsdp:
        map_fsdp_words(m, fsdp, "fsdp")
    fsdp_config = m.get(data, "fsdp_config")
    if isinstance(fsdp_config, dict):
        map_fsdp_dict(m, fsdp_config, "fsdp_config.")


def _batches(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """`per_device_train_batch_size`, unset the Trainer's default (TRL's SFTConfig and
    LLaMA-Factory's arguments keep it), and the evaluation batch when evaluation is on:
    `eval_strategy` other than "no" (`evaluation_strategy` before transformers 4.46) runs
    `per_device_eval_batch_size` rows per device, default 8 as well (transformers 5.25.0
    training_args.py:777, 1106, 1128, 1571-1572; `estimator.train_config.evaluation`)."""
    batch = m.get(data, "per_device_train_batch_size")
    if batch is None:
        batch = HF_DEFAULT_BATCH
        m.set("batch", batch, "(per_device_train_batch_size unset: the Trainer's default 8)")
        m.warnings.append(
            "per_device_train_batch_size: unset, so the Trainer's default of 8 rows per device"
        )
    else:
        m.set("batch", batch, "per_device_train_batch_size")
    m.get(data, "eval_strategy")
    m.get(data, "evaluation_strategy")


def map_eval_batch(m: TrainConfigMapping, data: dict[str, Any], sft: bool) -> None:
    """The evaluation pass when `eval_strategy` is on: `per_device_eval_batch_size` rows per
    device, default 8 (transformers 5.25.0 training_args.py:777, 1128), as `eval_batch`
    (`estimator.train_config.evaluation`; TRL's SFTTrainer, `sft`, asks Liger to skip the
    logits). Call after the loss and the layout are read."""
    rows = m.get(data, "per_device_eval_batch_size")
    if not evaluates(data):
        return
    if rows is None:
        rows = HF_DEFAULT_BATCH
        m.warnings.append(
            "per_device_eval_batch_size: unset, so the Trainer's default of 8 rows per device "
            "for each evaluation step"
        )
    set_eval_batch(m, rows, "per_device_eval_batch_size", skips_liger_logits=sft)


def map_evaluation(m: TrainConfigMapping, data: dict[str, Any], sft: bool) -> None:
    """`map_eval_batch`, or under a preference objective, whose evaluation pass is not
    modelled, the evaluation key reported. Call after the objective is read."""
    if m.setup.get("objective") not in PREFERENCE:
        map_eval_batch(m, data, sft)
    elif evaluates(data):
        key = "eval_strategy" if "eval_strategy" in data else "evaluation_strategy"
        objective = m.setup["objective"]
        m.ignore(
            key,
            f"the evaluation pass of {objective} is not modelled: the training step alone is "
            "priced",
        )


def evaluates(data: dict[str, Any]) -> bool:
    """Whether the Trainer evaluates during training: `eval_strategy` other than "no"
    (`evaluation_strategy` before transformers 4.46; training_args.py:1106, 1571-1572)."""
    strategy = data.get("eval_strategy") or data.get("evaluation_strategy") or "no"
    return str(strategy).lower() != "no"


def _map_liger(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    if not m.get(data, "use_liger_kernel"):
        m.get(data, "liger_kernel_config")
        return
    config = m.get(data, "liger_kernel_config") or {}
    config = config if isinstance(config, dict) else {}
    # liger-kernel 0.8.5 monkey_patch.py:259-266 (apply_liger_kernel_to_llama): rope, rms_norm,
    # swiglu and fused_linear_cross_entropy default to True; the Trainer passes the config on
    # (transformers 5.17.0 integrations/liger.py:28-53)
    norm_on, swiglu_on = config.get("rms_norm") is not False, config.get("swiglu") is not False
    if norm_on and swiglu_on:
        m.set("liger_kernels", True, "use_liger_kernel")
    elif norm_on or swiglu_on:
        m.ignore(
            "liger_kernel_config",
            "one of Liger's rms_norm / swiglu kernels is off: trainfit models the two together "
            "(estimator/memory/liger.py), so neither is counted",
        )
    if config.get("fused_linear_cross_entropy") is False:
        return
    m.set("loss", "liger", "use_liger_kernel")


def map_optim(m: TrainConfigMapping, name: object, key: str) -> None:
    if name is None:
        name, key = HF_DEFAULT_OPTIM, f"{key} (default {HF_DEFAULT_OPTIM})"
    fields = HF_OPTIMIZERS.get(str(name).lower())
    if fields is None:
        m.ignore(key, f"optimizer {name!r} is not modelled; trainfit keeps its own optimizer")
        return
    for field, value in fields.items():
        m.set(field, value, key)


def map_sft(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """TRL's own SFTConfig keys."""
    length = m.get(data, "max_length")
    key = "max_length"
    if length is None:
        length, key = m.get(data, "max_seq_length"), "max_seq_length"
    if length is None and "max_length" not in data:
        length, key = 1024, "max_length (SFTConfig default)"
    if length is not None:
        m.seq_lens = [whole_number(length, key.split(" ")[0])]
        m.origin["seq_lens"] = key
    if m.get(data, "packing"):
        m.set_run("packing", True, "packing")
        m.set_run("packing_strategy", m.get(data, "packing_strategy") or "bfd", "packing_strategy")
    padding_free = m.get(data, "padding_free")
    if padding_free:
        m.ignore("padding_free", "padding-free batches are not modelled (rows count as padded)")
    batch = m.setup.get("batch")
    if not m.run.get("packing") and not padding_free and isinstance(batch, int) and batch > 1:
        # trl v1.9.0 trl/trainer/sft_trainer.py:504-505: DataCollatorForLanguageModeling pads
        # attention_mask with 0 to the batch's longest row
        m.set("padded_batches", True, "per_device_train_batch_size > 1 without packing")
    loss_type = m.get(data, "loss_type")
    smoothing = m.get(data, "label_smoothing_factor")
    if "loss" not in m.setup:
        if loss_type in (None, "nll") and isinstance(smoothing, int | float) and smoothing > 0:
            m.set("loss", "full", "label_smoothing_factor")
        elif loss_type in (None, "nll", "chunked_nll", "dft"):
            m.set("loss", "chunked", "loss_type" if loss_type else "loss_type (default nll)")
        else:
            m.ignore("loss_type", f"loss {loss_type!r} is not modelled; counted as full")
    for k in ("dataset_text_field", "completion_only_loss", "assistant_only_loss"):
        m.get(data, k)


def map_model_keys(m: TrainConfigMapping, data: dict[str, Any], prefix: str = "") -> None:
    """`attn_implementation`, `dtype`/`torch_dtype` (TRL ModelConfig, model_init_kwargs)."""
    key = prefix + "attn_implementation"
    map_attention(m, m.get(data, "attn_implementation", prefix), key)
    for k in ("dtype", "torch_dtype"):
        dtype = m.get(data, k, prefix)
        check_load_dtype(dtype, prefix + k)
        if dtype in ("float64", "double"):
            m.ignore(prefix + k, "a float64 load is not modelled: priced as the float32 one")
        if dtype in ("float32", "float") and "autocast" not in m.setup:
            m.set("precision", "fp32", prefix + k)


def map_peft_keys(m: TrainConfigMapping, data: dict[str, Any], base_dir: Path | None) -> None:
    """TRL ModelConfig keys (`trl sft --config` YAML mixes them with SFTConfig)."""
    name = m.get(data, "model_name_or_path")
    if name:
        m.model = with_revision(str(name), m.get(data, "model_revision"), base_dir)
    map_model_keys(m, data)
    four, eight = m.get(data, "load_in_4bit"), m.get(data, "load_in_8bit")
    if m.get(data, "use_peft") or four or eight:
        m.set("method", "qlora" if four else "lora", "load_in_4bit" if four else "use_peft")
        if eight:
            m.set("base", "int8", "load_in_8bit")
        for field, key, default in TRL_LORA_DEFAULTS:
            value = m.get(data, key)
            m.set(
                field, default if value is None else value, key + (" (default)" * (value is None))
            )
        targets = lora_targets(m.get(data, "lora_target_modules"))
        if targets is None:  # trl f2cd5771 utils.py:267 passes None on: peft picks them
            m.set("lora_targets", [PEFT_DEFAULT], "lora_target_modules (unset: peft's default)")
        else:
            m.set("lora_targets", targets, "lora_target_modules")
        saved = trains_embeddings(m.get(data, "lora_modules_to_save"))
        m.set("train_embeddings", saved, "lora_modules_to_save")
    if four:
        nested = m.get(data, "use_bnb_nested_quant")
        m.set("double_quant", bool(nested), "use_bnb_nested_quant")
    if m.get(data, "use_dora"):
        m.ignore("use_dora", "DoRA's extra magnitude vectors and activations are not modelled")
    m.get(data, "bnb_4bit_quant_type")


def read_hf(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    preference = preference_trainer(data)  # KTO's, CPO's, ORPO's config (trl_preference.py)
    dpo = preference is None and is_dpo_config(data)
    # DPOConfig and the other preference configs change the defaults SFTConfig does
    sft = preference is not None or dpo or is_sft_config(data)
    m = TrainConfigMapping("trl" if sft else "hf-trainer")
    map_peft_keys(m, data, base_dir)
    map_trainer_args(m, data, sft)
    if preference is not None:
        map_preference(m, data, preference)
    elif dpo:
        map_dpo(m, data)
    elif sft:
        map_sft(m, data)
    else:
        set_trainer_loss(m, "transformers Trainer")
    init = m.get(data, "model_init_kwargs") if sft else None  # TRL's load options
    if isinstance(init, dict):
        map_model_keys(m, init, "model_init_kwargs.")
    m.get(data, "deepspeed")
    map_evaluation(m, data, sft)
    _loaded_dtype(m, data)
    m.warn_unread(data)
    return m


# a 16-bit load: float16 has bfloat16's bytes, so it trains as the `bf16` precision too
SIXTEEN_BIT_NAMES = ("bfloat16", "float16", "half")
# the load dtypes TRL accepts: trl@f2cd577 trl/trainer/utils.py:1144-1153
# (`create_model_from_path` raises ValueError for any other value of `dtype`)
TRL_DTYPES = ("auto", "bfloat16", "float16", "float32")
# `torch_dtype` goes to transformers' from_pretrained as it is: "auto", the name of a torch
# dtype or a dict by sub-config (transformers 5.25.0 modeling_utils.py:828-862 `_get_dtype`:
# `getattr(torch, dtype)`, ValueError otherwise), of which these are the floating names
TORCH_DTYPES = (*TRL_DTYPES, "float64", "half", "float", "double")


def check_load_dtype(value: object, key: str) -> None:
    """A TRL config's load dtype (`dtype`, `torch_dtype`, under `model_init_kwargs.` too) is
    one its consumer accepts, or bad input naming the key: the run would stop there."""
    torch_dtype = key.endswith("torch_dtype")
    if value is None or (torch_dtype and isinstance(value, dict)):
        return
    allowed = TORCH_DTYPES if torch_dtype else TRL_DTYPES
    if not isinstance(value, str) or value not in allowed:
        raise EstimatorInputError(
            f"train_config.{key}",
            f"expected one of {', '.join(allowed)}, got {value!r} (TRL and transformers refuse "
            "to load a model in it)",
        )


def _loaded_dtype(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """The dtype the model is loaded in: TRL's `dtype` (ModelConfig, passed on by trl/scripts/
    sft.py:78) or `model_init_kwargs.dtype` (trl@f2cd577 trl/trainer/utils.py:1144-1149
    `create_model_from_path`: float32 unless given). A full fine-tune loaded in bf16 trains
    bf16 weights with bf16 gradients and optimizer states (the Trainer and accelerate's
    autocast never upcast them): trainfit's `bf16` precision, where `mixed` on the hf stack is
    the fp32 load (stack fact `mixed_precision`). Not under FSDP (accelerate 1.16.0 upcasts
    the trained parameters to fp32 for FSDP1, accelerator.py:1960-2023, and FSDP2,
    utils/fsdp_utils.py:798-806) nor DeepSpeed (fp32 master partitions): `mixed` there. `auto`
    takes the checkpoint's dtype, which the file does not say: reported, `mixed` kept."""
    sharded = m.setup.get("sharding") not in (None, "none", "device_map")
    if sharded or m.setup.get("parallel") or data.get("deepspeed"):
        return
    if m.setup.get("method", "full") != "full":
        return
    init = data.get("model_init_kwargs")
    sources = [("", data)] + ([("model_init_kwargs.", init)] if isinstance(init, dict) else [])
    for prefix, where in sources:
        for key in ("dtype", "torch_dtype"):
            value = str(where.get(key) or "")
            if value in SIXTEEN_BIT_NAMES and m.setup.get("precision") != "fp32":
                m.set("precision", "bf16", prefix + key)
            elif value == "auto" and m.setup.get("precision") == "mixed":
                m.ignore(
                    prefix + key,
                    "auto: the checkpoint's own dtype (bf16 for most, which trains as --precision "
                    "bf16); this file does not say it, so trainfit keeps the fp32 load of `mixed`",
                )
