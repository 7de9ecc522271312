"""LLaMA-Factory YAML (`llamafactory-cli train config.yaml`).

Option names and defaults read from LLaMA-Factory ff6d4d12 (2026-08-18),
`src/llamafactory/hparams/`:
- `model_args.py`: `model_name_or_path` (38), `adapter_name_or_path`, `flash_attn` (117; auto |
  disabled | sdpa | fa2 | fa3, extras/constants.py:147), `use_unsloth` (129), `use_unsloth_gc`
  (133), `enable_liger_kernel` (137), `disable_gradient_checkpointing` (145, default False: the
  loader turns checkpointing on), `upcast_layernorm`, `upcast_lmhead_output` (153-157),
  `quantization_method` (279, default bnb), `quantization_bit` (283), `double_quantization`
  (291, default True).
- `finetuning_args.py`: `additional_target` (59, modules_to_save), `lora_alpha` (69; default
  `lora_rank * 2`, line 587), `lora_dropout` (73, default 0.0), `lora_rank` (77, default 8),
  `lora_target` (81, default `all`), `use_dora`, `use_galore`/`use_apollo`/`use_badam`,
  `pure_bf16` (456, bf16 without AMP), `stage` (460), `finetuning_type` (464, default lora).
- `data_args.py`: `cutoff_len` (46, default 2048), `packing` (108), `neat_packing` (112).
- `stage: dpo` (`pref_loss`, 183; `use_ref_model`, 593; `ref_model`): `_dpo`.
The rest are HF `Seq2SeqTrainingArguments` keys (`per_device_train_batch_size`, `optim`, `bf16`,
`deepspeed`, ...), read as for a TRL/HF config. A v1 config (`model:` instead of
`model_name_or_path:`, `peft_config:`, `micro_batch_size:`) is read by `llamafactory_v1.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.train_config.hf_args import map_evaluation, map_trainer_args
from estimator.train_config.llamafactory_v1 import V1_KEYS, read_llamafactory_v1
from estimator.train_config.result import TrainConfigMapping, whole_number
from estimator.train_config.vocab import (
    AS_SFT_UNDERESTIMATES,
    lora_targets,
    map_attention,
    set_trainer_loss,
    trains_embeddings,
    with_revision,
)

# keys only LLaMA-Factory uses (TRL's ModelConfig says lora_r, not lora_rank)
LF_KEYS = (
    "stage",
    "finetuning_type",
    "cutoff_len",
    "template",
    "quantization_bit",
    "lora_target",
    "lora_rank",
    "additional_target",
    "flash_attn",
    "enable_liger_kernel",
    "disable_gradient_checkpointing",
    "neat_packing",
    "pure_bf16",
)


# the Megatron-Core options of LLaMA-Factory's megatron examples (examples/megatron*/*.yaml)
MEGATRON_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
    "use_distributed_optimizer",
)


def _megatron_on(value: object) -> bool:
    return value is True or (type(value) is int and value > 1)


def read_llamafactory(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    if "model_name_or_path" not in data and any(k in data for k in ("model", *V1_KEYS)):
        return read_llamafactory_v1(data, base_dir)
    m = TrainConfigMapping("llamafactory")
    name = m.get(data, "model_name_or_path")
    if name:
        m.model = with_revision(str(name), m.get(data, "model_revision"), base_dir)
    map_trainer_args(m, data, sft=False)
    _finetuning(m, data)
    _model_args(m, data)
    # train/sft/trainer.py:47, 151-162 (CustomSeq2SeqTrainer(Seq2SeqTrainer).compute_loss calls
    # the Trainer's unless use_asft_loss); train/pt/trainer.py:33, 92-93 the same
    stage = data.get("stage")
    if stage in (None, "sft", "pt"):
        set_trainer_loss(m, "LLaMA-Factory's CustomSeq2SeqTrainer / CustomTrainer")
    elif stage == "dpo" and not data.get("pure_bf16"):
        _dpo(m, data)
    else:  # kto, ppo, rm, dpo under pure_bf16: TRL's trainers or a value head, other losses
        reason = f"stage {stage!r} is {AS_SFT_UNDERESTIMATES}"
        if stage == "dpo":
            reason = (
                "stage 'dpo' under pure_bf16 (train/dpo/trainer.py:230 upcasts the bf16 logits "
                "to fp32 itself, a copy the modelled DPOTrainer without autocast does not make) "
                f"is {AS_SFT_UNDERESTIMATES}"
            )
        m.ignore("stage", reason)
    _custom_losses(m, data)
    length = m.get(data, "cutoff_len")
    m.seq_lens = [whole_number(length, "cutoff_len") if length is not None else 2048]
    m.origin["seq_lens"] = "cutoff_len" if length is not None else "cutoff_len (default 2048)"
    if m.get(data, "packing") or m.get(data, "neat_packing"):
        m.set_run("packing", True, "neat_packing" if data.get("neat_packing") else "packing")
        m.set_run("packing_strategy", "greedy_knapsack", "packing")
    elif stage in (None, "sft"):
        # LLaMA-Factory ff6d4d12 src/llamafactory/train/sft/workflow.py:62-65: the SFT collator
        # pads every batch to a multiple of 8 when training, so rows carry padding
        m.set("padded_batches", True, "packing off (SFT rows padded to a multiple of 8)")
    for key in ("stage", "template", "dataset", "dataset_dir", "deepspeed", "train_on_prompt"):
        m.get(data, key)
    # model_args.py:177, model/loader.py:224-231: v1's `auto` kernels, NPU-only (v1
    # kernels/interface.py:31-32, 63-67): nothing on a CUDA card
    m.get(data, "use_v1_kernels")
    megatron = [k for k in MEGATRON_KEYS if _megatron_on(data.get(k))]
    if megatron:  # examples/megatron*: LLaMA-Factory's Megatron-Core path, not the HF Trainer
        m.ignore(
            megatron[0],
            "Megatron-Core's parallelism and distributed optimizer are not read: give "
            "--parallel (e.g. tp=4,pp=2,zero1)",
        )
    for key in MEGATRON_KEYS:
        m.get(data, key)
    m.get(data, "plot_loss")  # a loss-curve image after training (finetuning_args.py:570)
    map_evaluation(m, data, sft=False)
    m.warn_unread(data)
    return m


def _dpo(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """`stage: dpo` with AMP: LLaMA-Factory ff6d4d12's CustomDPOTrainer (train/dpo/trainer.py)
    over the pairwise collator (train/dpo/workflow.py:48-54: each pair's chosen and rejected in
    one batch, padded to a multiple of 8). Its step takes the log-probabilities from the full
    logits (`concatenated_forward`, trainer.py:219-253: `logits.to(torch.float32)`, a no-op on
    the fp32 logits accelerate returns under autocast, then `get_batch_logps`,
    trainer_utils.py:592-612: one fp32 `log_softmax` of all of them, saved, and a gather); the
    reference's forward does the same under no_grad (:255-275) with the policy's logits and
    log-softmax alive: four fp32 logits-sized tensors, the bytes of TRL 1.0-1.9's step that
    `--objective dpo --loss full` models (estimator/memory/logits.py `preference_full_logits_bytes`:
    its four at the loss's backward), so it is read as that. The reference is the policy with
    its adapters disabled under LoRA, else a second model (trainer_utils.py:116-148; loaded in
    the compute dtype where the policy trains in fp32 under AMP, which the estimate counts at
    the policy's: an overestimate of full fine-tuning's); `pref_loss` orpo and simpo use none
    (finetuning_args.py:593): `dpo-precomputed`, whose four fp32 tensors are one more than
    their step's three (an overestimate). Dropout is off (trainer.py:51-60
    `disable_dropout`, default true). Not modelled: a separate `ref_model` under LoRA (its
    weights); the `pure_bf16` step (the caller reports it)."""
    pref_loss = m.get(data, "pref_loss") or "sigmoid"
    reference = pref_loss not in ("orpo", "simpo")
    objective = "dpo" if reference else "dpo-precomputed"
    m.set("objective", objective, "stage: dpo" + ("" if reference else f", pref_loss {pref_loss}"))
    m.set("loss", "full", "stage: dpo (CustomDPOTrainer: the full logits, fp32 log_softmax)")
    m.set("padded_batches", True, "stage: dpo (pairs padded to a multiple of 8)")
    separate = m.get(data, "ref_model")
    if m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, "stage: dpo (disable_dropout, default true)")
        if separate:
            m.ignore("ref_model", "a separate reference model under LoRA: its weights not counted")
    elif separate:
        m.ignore("ref_model", "counted as a copy of the policy's weights, whatever its size")
    for key in ("ref_model_adapters", "ref_model_quantization_bit"):
        if m.get(data, key):
            m.ignore(key, "the reference counted as the policy's weights, unquantized")
    for key in ("pref_beta", "pref_ftx", "dpo_label_smoothing", "simpo_gamma", "pref_bco_weight"):
        m.get(data, key)  # the loss's arithmetic on per-sequence values: no memory


def _custom_losses(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """SFT's own losses and FP8 (hparams/finetuning_args.py:526-538, training_args.py:123-130).
    ASFT loads a reference model (train/sft/workflow.py:55-57) and holds its full logits, made
    under no_grad, through the policy's forward and loss (train/sft/trainer.py:151-159); DFT and
    EAFT are compute_loss_func's over the model's full logits (trainer.py:105-117)."""
    if m.get(data, "use_asft_loss"):
        m.ignore(
            "use_asft_loss",
            "ASFT's reference model and its full logits are not counted (an underestimate)",
        )
    for key in ("use_dft_loss", "use_eaft_loss"):
        if m.get(data, key):
            m.ignore(key, "its loss over the full logits: the extra fp32 tensors are not modelled")
    if m.get(data, "fp8"):
        m.ignore("fp8", "FP8 training (accelerate's FP8 recipe) is not modelled: priced in bf16")
    m.get(data, "fp8_backend")
    m.get(data, "fp8_enable_fsdp_float8_all_gather")
    # LoRA+'s learning-rate ratio (finetuning_args.py:91): the optimizer's groups, no memory
    m.get(data, "loraplus_lr_ratio")


def _finetuning(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    kind = m.get(data, "finetuning_type") or "lora"
    bits = m.get(data, "quantization_bit")
    method_key = "finetuning_type" if "finetuning_type" in data else "finetuning_type (default)"
    if kind == "full":
        m.set("method", "full", method_key)
    elif kind == "lora":
        m.set("method", "qlora" if bits == 4 else "lora", method_key)
        if bits == 8:
            m.set("base", "int8", "quantization_bit")
        rank = m.get(data, "lora_rank")
        rank = 8 if rank is None else whole_number(rank, "lora_rank")
        m.set("lora_rank", rank, "lora_rank")
        alpha = m.get(data, "lora_alpha")
        m.set("lora_alpha", alpha if alpha is not None else rank * 2, "lora_alpha")
        dropout = m.get(data, "lora_dropout")
        m.set("lora_dropout", 0.0 if dropout is None else dropout, "lora_dropout")
        m.set("lora_targets", lora_targets(m.get(data, "lora_target") or "all"), "lora_target")
        saved = trains_embeddings(m.get(data, "additional_target"))
        m.set("train_embeddings", saved, "additional_target")
        if bits == 4:
            double = m.get(data, "double_quantization")
            m.set("double_quant", True if double is None else bool(double), "double_quantization")
    else:
        m.ignore("finetuning_type", f"{kind!r} fine-tuning is not modelled (full/lora are)")
    if bits is not None and bits not in (4, 8):
        m.ignore("quantization_bit", f"{bits}-bit quantization is not modelled (4/8 are)")
    method = m.get(data, "quantization_method")
    if bits is not None and method not in (None, "bnb", "bitsandbytes"):
        m.ignore("quantization_method", f"{method!r} quantization is not modelled (bnb is)")
    for key in ("use_dora", "use_galore", "use_apollo", "use_badam", "use_llama_pro"):
        if m.get(data, key):
            m.ignore(key, f"{key[4:]} is not modelled")


def _model_args(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    attn = m.get(data, "flash_attn")
    map_attention(m, None if attn == "auto" else attn, "flash_attn")
    if m.get(data, "use_unsloth"):
        m.set("stack", "unsloth", "use_unsloth")
    if m.get(data, "use_unsloth_gc"):
        m.set("checkpointing", "offload", "use_unsloth_gc")
    elif m.get(data, "disable_gradient_checkpointing"):
        m.set("checkpointing", "none", "disable_gradient_checkpointing")
    elif "checkpointing" not in m.setup:
        m.set("checkpointing", "gpu", "disable_gradient_checkpointing (default False)")
    if m.get(data, "enable_liger_kernel"):
        m.set("loss", "liger", "enable_liger_kernel")
        # hiyouga/LlamaFactory@355d5c5e model/model_utils/liger_kernel.py:30-97: the model's
        # apply_liger_kernel_to_* with its defaults (rope, rms_norm, swiglu on), before loading
        m.set("liger_kernels", True, "enable_liger_kernel")
    if m.get(data, "pure_bf16"):
        m.set("precision", "bf16", "pure_bf16")
        m.set("autocast", False, "pure_bf16")
    for key in ("upcast_layernorm", "upcast_lmhead_output"):
        if m.get(data, key):
            m.ignore(key, "fp32 upcast of norms / lm_head output is not modelled")
    if m.get(data, "shift_attn"):
        m.ignore("shift_attn", "LongLoRA shift attention is not modelled")
    m.get(data, "adapter_name_or_path")
    m.get(data, "infer_dtype")
