"""axolotl YAML.

Option names and defaults read from axolotl 067b021c (2026-07-24), `src/axolotl/utils/schemas/`:
- `model.py`: `base_model` (17), `base_model_config` (22), `revision_of_model` (alias
  `model_revision`).
- `peft.py`: `load_in_8bit`, `load_in_4bit`, `adapter` (lora | qlora), `lora_r`, `lora_alpha`,
  `lora_dropout` (default 0.0), `lora_target_modules`, `lora_target_linear`,
  `lora_modules_to_save`, `peft_use_dora`, `bnb_config_kwargs` (lines 31-149).
- `training.py`: `gradient_accumulation_steps` (71), `micro_batch_size` (77), `batch_size` (83),
  `optimizer` (122, default `adamw_torch_fused`), `num_epochs` (267).
- `config.py`: `bf16` (559, true | "auto"), `fp16`, `gradient_checkpointing` (600: true |
  "offload" | "offload_disk"), `selective_checkpointing`, `activation_offloading` (623),
  `sequence_len` (665), `sample_packing` (688), `xformers_attention` / `sdp_attention` /
  `flex_attention` / `flash_attention` / `eager_attention` / `attn_implementation` (784-839),
  `chunked_cross_entropy` + `_num_chunks` (978-984), `deepspeed` (1032), `fsdp_config` (1049)
  and its older companion `fsdp` (a list of transformers' FSDP words),
  `torch_compile` (1148), `plugins` (1423).
- `rl: dpo|ipo` (TRL 1.8.0's DPOTrainer, axolotl's pin): `_dpo`; `rl: orpo|simpo` (its
  ORPOTrainer, CPOTrainer): `_orpo`; `rl: kto` (its KTOTrainer): `_kto`.
- `src/axolotl/integrations/liger/args.py` line 55 `liger_fused_linear_cross_entropy`;
  `integrations/cut_cross_entropy/args.py` line 33 `cut_cross_entropy`.
- `src/axolotl/loaders/model.py` line 718: QLoRA's BitsAndBytesConfig sets
  `bnb_4bit_use_double_quant: True` (overridable through `bnb_config_kwargs`).
- `config.py` 923 `quantize_moe_experts` (the 3-D expert banks in NF4 under QLoRA, in int8
  under `load_in_8bit`, `monkeypatch/moe_quant.py`), trainfit's `quantize_experts`.
axolotl runs the HF Trainer, so the stack is `hf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.objective import PREFERENCE
from estimator.train_config.evaluation import set_eval_batch
from estimator.train_config.hf_args import map_optim
from estimator.train_config.result import TrainConfigMapping, whole_number
from estimator.train_config.sharding import map_fsdp_dict, map_fsdp_words
from estimator.train_config.trl_dpo import map_dpo_objective
from estimator.train_config.vocab import (
    AS_SFT_UNDERESTIMATES,
    add_bank_targets,
    lora_targets,
    map_attention,
    set_trainer_loss,
    trains_embeddings,
    with_revision,
)

# schemas/config.py: custom LoRA autograd + Triton kernels ("for speed and memory savings",
# docs/lora_optims), the older unsloth_* switches, ALST tiled MLP
KERNEL_FLAGS = (
    "lora_mlp_kernel",
    "lora_qkv_kernel",
    "lora_o_kernel",
    "unsloth_lora_mlp",
    "unsloth_lora_qkv",
    "unsloth_lora_o",
    "unsloth_rms_norm",
    "unsloth_rope",
    "unsloth_cross_entropy_loss",
    "tiled_mlp",
    # the Qwen 3 / Llama fused attention patches (loaders/patch_manager.py:540-580) and the
    # older flash-attn MLP / RMSNorm patches (:995-1002)
    "fused_attn_kernel",
    "flash_attn_fuse_mlp",
)
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def _plugins(data: dict[str, Any]) -> list[str]:
    plugins = data.get("plugins")
    return [str(p) for p in plugins] if isinstance(plugins, list) else []


ATTENTION_FLAGS = (
    ("flash_attention", "flash"),
    ("sdp_attention", "sdpa"),
    ("eager_attention", "eager"),
)


def read_axolotl(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    m = TrainConfigMapping("axolotl")
    m.set("stack", "hf", "(axolotl runs the HF Trainer)")
    _model(m, data, base_dir)
    _adapter(m, data)
    length = m.get(data, "sequence_len")
    if length is not None:
        m.seq_lens = [whole_number(length, "sequence_len")]
        m.origin["seq_lens"] = "sequence_len"
    _batches(m, data)
    m.set_run("epochs", m.get(data, "num_epochs"), "num_epochs")
    map_optim(m, m.get(data, "optimizer"), "optimizer")
    _precision(m, data)
    _checkpointing(m, data)
    _attention(m, data)
    _loss(m, data)
    if m.get(data, "sample_packing"):
        m.set_run("packing", True, "sample_packing")
        m.set_run("packing_strategy", "multipack", "sample_packing")
    _padding(m, m.get(data, "pad_to_sequence_len"))
    words = m.get(data, "fsdp")  # the older list form: [full_shard, auto_wrap, offload]
    if words:
        map_fsdp_words(m, words, "fsdp")
    fsdp = m.get(data, "fsdp_config")
    if isinstance(fsdp, dict) and fsdp:
        map_fsdp_dict(m, fsdp, "fsdp_config.", data.get("fsdp_version"))
    m.get(data, "fsdp_version")
    _nd_parallel(m, data, bool(words or fsdp))
    m.get(data, "deepspeed")
    _full_fine_tuning_dtype(m, data, bool(words or fsdp))
    compiled = m.get(data, "torch_compile")
    if compiled is not None:
        m.set("compile", bool(compiled), "torch_compile")
    for key in ("datasets", "plugins", "trust_remote_code", "eval_sample_packing"):
        m.get(data, key)
    # no device memory (utils/schemas/config.py): resuming from the output directory (:222),
    # the streaming dataset's sample buffer on the host (:777), flex attention's
    # torch.compile arguments (:802)
    for key in ("auto_resume_from_checkpoints", "streaming_multipack_buffer_size"):
        m.get(data, key)
    m.get(data, "flex_attn_compile_kwargs")
    if m.get(data, "fp8"):  # utils/schemas/config.py:568-580
        m.ignore("fp8", "FP8 training (torchao's float8 linears) is not modelled: priced in bf16")
    m.get(data, "fp8_enable_fsdp_float8_all_gather")
    if m.get(data, "flash_attn_rms_norm"):  # utils/schemas/deprecated.py:136-140
        m.ignore("flash_attn_rms_norm", "removed from axolotl, which refuses a config setting it")
    # the loss watchdog stops a run whose loss stays over a threshold (utils/callbacks/
    # __init__.py:63-78, a callback reading the logged loss): no memory
    for key in ("loss_watchdog_threshold", "loss_watchdog_patience"):
        m.get(data, key)
    _eval_batch(m, data)  # after the loss and the layout (AxolotlTrainer passes no skip_logits)
    m.warn_unread(data)
    return m


# axolotl 067b021c core/builders/rl.py:71-73, 197-199: `rl: dpo` and `rl: ipo` train with
# AxolotlDPOTrainer (core/trainers/dpo/trainer.py: TRL's DPOTrainer, its loss unchanged) and
# AxolotlDPOConfig (DPOConfig); ipo is its loss_type (core/trainers/dpo/__init__.py:30-31)
DPO_RL = ("dpo", "ipo")


def _dpo(m: TrainConfigMapping, data: dict[str, Any], rl: str) -> None:
    """`rl: dpo|ipo`: TRL 1.8.0's DPOTrainer (axolotl 067b021c pyproject.toml:23 pins
    trl==1.8.0), which takes the log-probabilities from the full logits (trl v1.8.0
    trainer/dpo_trainer.py:1289-1296): `objective` dpo (or dpo-precomputed) with `loss` full
    (estimator/objective.py). DPOStrategy passes max_length = sequence_len and the DPO keys
    below (core/trainers/dpo/__init__.py:22-46); DPOConfig's disable_dropout (default true,
    trl v1.8.0 dpo_config.py:178) zeroes the adapters' dropout (dpo_trainer.py:890-891)."""
    map_dpo_objective(m, data, f"rl: {rl}")  # passed on to DPOConfig (dpo/__init__.py:43-46)
    if m.setup.get("loss") in ("liger", "cce"):  # their patched forwards fuse the loss only
        # when given labels, which DPOTrainer does not pass
        m.ignore(
            m.origin["loss"],
            "DPOTrainer calls the model without labels and reads its logits (trl v1.8.0 "
            "dpo_trainer.py:1289-1293)",
        )
    m.set("loss", "full", f"rl: {rl} (TRL 1.8.0's DPOTrainer: the full logits)")
    if m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, "rl: dpo (DPOConfig disable_dropout, default true)")
    if m.get(data, "dpo_use_liger_kernel"):
        m.ignore(
            "dpo_use_liger_kernel",
            "Liger's fused DPO loss (trl v1.8.0 dpo_trainer.py:1173-1276) is not modelled: "
            "priced with the full logits, an overestimate",
        )
    if m.get(data, "dpo_padding_free"):
        m.ignore(
            "dpo_padding_free",
            "DPOTrainer falls back to padded batches (trl v1.8.0 dpo_trainer.py:686-690)",
        )
    for key in ("dpo_loss_type", "dpo_loss_weights", "dpo_label_smoothing", "dpo_use_weighting"):
        m.get(data, key)  # the loss's arithmetic on per-sequence values: no memory


# axolotl 067b021c core/builders/rl.py:75-80, 135-145: `rl: orpo` trains with
# AxolotlORPOTrainer (TRL's ORPOTrainer, core/trainers/trl.py), `rl: simpo` with
# AxolotlCPOTrainer and loss_type simpo, passing cpo_alpha only when the config sets it
ORPO_RL = ("orpo", "simpo")


def _orpo(m: TrainConfigMapping, data: dict[str, Any], rl: str) -> None:
    """`rl: orpo|simpo`: TRL 1.8.0's ORPOTrainer or CPOTrainer (trl/experimental/orpo, cpo),
    both reading the full logits (estimator/objective.py): `objective` orpo; under simpo cpo,
    whose chosen-half cross-entropy runs unless `cpo_alpha` is 0 (CPOConfig's default 1.0,
    trl v1.8.0 cpo_config.py:133-136, cpo_trainer.py:841-844), or simpo where it is 0; `loss`
    full. max_length = sequence_len (core/builders/base.py:681-682). Both configs'
    disable_dropout (default true, orpo_config.py:98-101, cpo_config.py:129-132) zeroes the
    adapters' dropout (orpo_trainer.py:340-341, cpo_trainer.py:330-331)."""
    if rl == "orpo":
        m.set("objective", "orpo", "rl: orpo (TRL 1.8.0's ORPOTrainer)")
    else:
        alpha = m.get(data, "cpo_alpha")
        if alpha is not None and float(alpha) == 0.0:
            m.set("objective", "simpo", "rl: simpo with cpo_alpha 0 (CPOTrainer, no NLL term)")
        else:
            why = "cpo_alpha" if alpha is not None else "cpo_alpha unset: CPOConfig's 1.0"
            m.set("objective", "cpo", f"rl: simpo (CPOTrainer; {why}: the chosen half's NLL)")
    if m.setup.get("loss") in ("liger", "cce"):  # their patched forwards fuse the loss only
        # when given labels, which neither trainer passes
        m.ignore(
            m.origin["loss"],
            f"TRL's {'ORPO' if rl == 'orpo' else 'CPO'}Trainer calls the model without labels "
            "and reads its logits (trl v1.8.0 orpo_trainer.py:774-780, cpo_trainer.py:817-823)",
        )
    m.set("loss", "full", f"rl: {rl} (TRL 1.8.0's trainer: the full logits)")
    if m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, f"rl: {rl} (disable_dropout, default true)")
    for key in ("orpo_alpha", "simpo_gamma", "rl_beta"):
        m.get(data, key)  # the loss's arithmetic on per-sequence values: no memory


def _kto(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """`rl: kto`: AxolotlKTOTrainer, TRL 1.8.0's KTOTrainer (core/builders/rl.py:77-78,
    149-159; core/trainers/trl.py) with KTOConfig's loss_type kto (trl v1.8.0
    kto_config.py:192-193), which reads the full logits and runs the reference's and a KL
    forward each step (estimator/objective.py): `objective` kto, `loss` full. Its micro-batch
    must hold two rows (kto_trainer.py:785-789; micro_batch_size 1 is refused naming the
    batch). KTOConfig's disable_dropout (default true, kto_config.py:153-156) zeroes the
    adapters' dropout (kto_trainer.py:910-914)."""
    m.set("objective", "kto", "rl: kto (TRL 1.8.0's KTOTrainer)")
    if m.setup.get("batch") is None:  # axolotl's default (utils/schemas/training.py:77-82)
        m.set("batch", 1, "micro_batch_size unset: axolotl's default 1")
    if m.setup.get("loss") in ("liger", "cce"):
        m.ignore(
            m.origin["loss"],
            "KTOTrainer calls the model without labels and reads its logits (trl v1.8.0 "
            "kto_trainer.py:1493-1496)",
        )
    m.set("loss", "full", "rl: kto (TRL 1.8.0's KTOTrainer: the full logits)")
    if m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, "rl: kto (disable_dropout, default true)")
    for key in ("kto_desirable_weight", "kto_undesirable_weight", "rl_beta"):
        m.get(data, key)  # the loss's weights: no memory


def _padding(m: TrainConfigMapping, pad_to_length: object) -> None:
    """Unpacked rows carry padding: axolotl 067b021c src/axolotl/core/builders/causal.py:383-394
    builds DataCollatorForSeq2Seq with padding=True and pad_to_multiple_of 64 (sequence_len's
    multiple with pad_to_sequence_len), so even one row is padded unless pad_to_sequence_len
    is false, which pads only to the batch's longest row."""
    if m.run.get("packing"):
        return
    batch = m.setup.get("batch")
    if pad_to_length is False:
        if isinstance(batch, int) and batch > 1:
            m.set("padded_batches", True, "micro_batch_size > 1 without sample_packing")
        return
    key = "pad_to_sequence_len" if pad_to_length else "sample_packing off (padded to x64)"
    m.set("padded_batches", True, key)


def _batches(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """`micro_batch_size` (default 1, utils/schemas/training.py:77-82) and the accumulation
    steps, which `normalize_config` derives as `batch_size // micro_batch_size` when only the
    total is given (utils/config/__init__.py:199-207); `eval_batch_size` (default
    `micro_batch_size`, :208-209) matters when there is an evaluation set (`val_set_size` > 0
    or `test_datasets`, core/builders/base.py:514-523)."""
    micro = m.get(data, "micro_batch_size")
    m.set("batch", micro, "micro_batch_size")
    rows = 1 if micro is None else whole_number(micro, "micro_batch_size")
    accum = m.get(data, "gradient_accumulation_steps")
    total = m.get(data, "batch_size")
    if accum is None and total is not None:
        derived = whole_number(total, "batch_size") // rows
        m.set("grad_accum", max(derived, 1), "batch_size // micro_batch_size")
    else:
        m.set("grad_accum", accum, "gradient_accumulation_steps")
    m.get(data, "val_set_size")
    m.get(data, "test_datasets")


def _eval_batch(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """With an evaluation set, `eval_batch_size` rows per device (default `micro_batch_size`,
    utils/config/__init__.py:208-209) as `eval_batch` (estimator.train_config.evaluation)."""
    rows = m.get(data, "eval_batch_size")
    if not _evaluates(data):
        return
    if m.setup.get("objective") in PREFERENCE:
        m.ignore("val_set_size", f"the evaluation pass of {m.setup['objective']} is not modelled")
        return
    micro = m.setup.get("batch", 1)
    set_eval_batch(m, rows if rows is not None else micro, "eval_batch_size")


def _evaluates(data: dict[str, Any]) -> bool:
    """An evaluation set: `val_set_size` > 0 or `test_datasets` (core/builders/base.py:514-523)."""
    val = data.get("val_set_size")
    return bool(data.get("test_datasets")) or (
        isinstance(val, int | float) and not isinstance(val, bool) and val > 0
    )


def _model(m: TrainConfigMapping, data: dict[str, Any], base_dir: Path | None) -> None:
    name = m.get(data, "base_model_config") or m.get(data, "base_model")
    m.get(data, "base_model")
    revision = m.get(data, "revision_of_model") or m.get(data, "model_revision")  # its alias
    if name:
        m.model = with_revision(str(name), revision, base_dir)
        m.origin["model"] = "base_model_config" if data.get("base_model_config") else "base_model"
    # loaders/model.py:661-676: a load-time quantization_config; Mxfp4Config with dequantize
    # loads gpt-oss's MXFP4 banks in bf16, the dtype trainfit counts them in
    quant = m.get(data, "model_quantization_config")
    kwargs = m.get(data, "model_quantization_config_kwargs")
    dequantize = isinstance(kwargs, dict) and kwargs.get("dequantize") is True
    if quant and not (quant == "Mxfp4Config" and dequantize):
        m.ignore("model_quantization_config", f"{quant} weights are not modelled (as bf16)")


def _adapter(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    adapter = m.get(data, "adapter")
    four, eight = m.get(data, "load_in_4bit"), m.get(data, "load_in_8bit")
    if adapter is None:
        m.set("method", "full", "adapter (unset)")
        if four or eight:
            m.ignore("load_in_4bit" if four else "load_in_8bit", "quantized base needs an adapter")
        return
    if adapter not in ("lora", "qlora"):
        m.ignore("adapter", f"adapter {adapter!r} is not modelled (lora/qlora are)")
        return
    m.set("method", "qlora" if adapter == "qlora" or four else "lora", "adapter")
    if eight and not four:
        m.set("base", "int8", "load_in_8bit")
    m.set("lora_rank", m.get(data, "lora_r"), "lora_r")
    m.set("lora_alpha", m.get(data, "lora_alpha"), "lora_alpha")
    dropout = m.get(data, "lora_dropout")
    m.set("lora_dropout", 0.0 if dropout is None else dropout, "lora_dropout")
    if m.get(data, "lora_target_linear"):
        m.set("lora_targets", ["all-linear"], "lora_target_linear")
    else:
        m.set(
            "lora_targets",
            lora_targets(m.get(data, "lora_target_modules"), string_is_regex=True),
            "lora_target_modules",
        )
    m.get(data, "lora_target_modules")
    # peft's target_parameters (loaders/adapter.py:172, 191), LoRA on the fused expert banks
    add_bank_targets(m, m.get(data, "lora_target_parameters"), "lora_target_parameters")
    m.set(
        "train_embeddings",
        trains_embeddings(m.get(data, "lora_modules_to_save")),
        "lora_modules_to_save",
    )
    if m.setup["method"] == "qlora":
        kwargs = m.get(data, "bnb_config_kwargs") or {}
        double = kwargs.get("bnb_4bit_use_double_quant", True) if isinstance(kwargs, dict) else True
        m.set(
            "double_quant",
            bool(double),
            "bnb_config_kwargs.bnb_4bit_use_double_quant"
            if isinstance(kwargs, dict) and "bnb_4bit_use_double_quant" in kwargs
            else "(axolotl QLoRA default, loaders/model.py:718)",
        )
    if m.get(data, "quantize_moe_experts"):
        # NF4 banks under load_in_4bit, int8 ones under load_in_8bit (monkeypatch/moe_quant.py:
        # 73-75 picks the mode, :24-66 the int8 parametrization)
        if m.setup["method"] == "qlora" or m.setup.get("base") == "int8":
            m.set("quantize_experts", True, "quantize_moe_experts")
        else:  # config.py:1876-1887 asks for load_in_4bit or load_in_8bit
            m.ignore(
                "quantize_moe_experts",
                "needs load_in_4bit or load_in_8bit (axolotl config.py:1876-1887); the banks are "
                "counted in the load dtype",
            )
    if m.get(data, "llama4_linearized_experts"):
        _linearized_experts(m)
    if m.get(data, "peft_use_dora"):
        m.ignore("peft_use_dora", "DoRA's extra magnitude vectors and activations not modelled")
    m.get(data, "lora_model_dir")


def _linearized_experts(m: TrainConfigMapping) -> None:
    """`llama4_linearized_experts` (config.py:1030; loaders/patch_manager.py:434-442): axolotl
    swaps Llama 4's fused expert banks for one nn.Linear per expert and projection
    (monkeypatch/models/llama4/modeling.py:13-87), which bitsandbytes quantizes under QLoRA
    like any Linear: the banks' bytes are NF4, trainfit's `quantize_experts`. Approximation: the
    per-expert Linear4bit dequantizes one expert at a time where trainfit's quantized banks
    dequantize a layer's bank (over is the safe side)."""
    if m.setup.get("method") == "qlora" and m.setup.get("quantize_experts") is None:
        m.set("quantize_experts", True, "llama4_linearized_experts")
    elif m.setup.get("method") != "qlora":
        m.ignore(
            "llama4_linearized_experts",
            "per-expert Linear modules outside QLoRA: the banks are counted fused, in the load "
            "dtype",
        )


def _nd_parallel(m: TrainConfigMapping, data: dict[str, Any], fsdp: bool) -> None:
    """axolotl's N-D parallelism (utils/distributed.py:299-377 `_get_parallel_config_kwargs`,
    accelerate's ParallelismConfig): `tensor_parallel_size` (transformers' tp_plan, loaders/
    model.py:848), `context_parallel_size` (ring attention over the sequence; older name
    `sequence_parallel_degree`), `dp_replicate_size` and `dp_shard_size` (FSDP; unset, the
    shard group takes the GPUs left) as a `parallel` layout; a given size fixes the GPU count
    only with both data sizes given (else the layout's fsdp takes what the GPUs leave)."""
    tp = m.count(data, "tensor_parallel_size")
    cp = m.count(data, "context_parallel_size")
    if cp == 1:
        cp = m.count(data, "sequence_parallel_degree")
    replicate = m.count(data, "dp_replicate_size")
    shard = m.get(data, "dp_shard_size")
    ep = m.count(data, "expert_parallel_size")
    if ep > 1:  # its ranks come out of the world size (distributed.py:333-340), not from dp
        m.ignore("expert_parallel_size", "axolotl's expert ranks outside the data-parallel ones")
    if tp == cp == replicate == 1 and shard is None:
        return
    items = [f"tp={tp}"] * (tp > 1) + [f"cp={cp}"] * (cp > 1)
    if fsdp:
        items.append("fsdp" if shard is None else f"fsdp={whole_number(shard, 'dp_shard_size')}")
        items += [f"dp={replicate}"] * (replicate > 1)
    else:
        items.append("dp" if replicate == 1 else f"dp={replicate}")
        if shard is not None:
            m.ignore("dp_shard_size", "needs an fsdp_config (axolotl refuses it without one)")
    keys = ("tensor_parallel_size", "context_parallel_size", "dp_replicate_size", "dp_shard_size")
    m.set("parallel", ",".join(items), " + ".join(k for k in keys if k in data))


def _precision(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    bf16, fp16 = m.get(data, "bf16"), m.get(data, "fp16")
    if bf16 or fp16:  # "auto" counts: bf16 where the card supports it
        m.set("autocast", True, "bf16" if bf16 else "fp16")
        m.set("precision", "mixed", "bf16" if bf16 else "fp16")
    m.get(data, "tf32")


def _fsdp_version(data: dict[str, Any]) -> str:
    """utils/schemas/validation.py:882-887: the top-level `fsdp_version`, else
    `fsdp_config.fsdp_version`, else 1."""
    version = data.get("fsdp_version")
    config = data.get("fsdp_config")
    if version is None and isinstance(config, dict):
        version = config.get("fsdp_version")
    return str(1 if version is None else version)


def _full_fine_tuning_dtype(m: TrainConfigMapping, data: dict[str, Any], fsdp: bool) -> None:
    """Full fine-tuning under `bf16`: axolotl loads the model in bf16 (utils/config/__init__.py:
    191-192 `cfg.torch_dtype = torch.bfloat16`, loaders/model.py:611-612 `dtype`) and nothing
    upcasts the trained weights on one device or under DDP (the HF Trainer and accelerate's
    prepare_model only wrap the forward in autocast), nor under FSDP2, where axolotl replaces
    accelerate's fsdp2_prepare_model with its own (monkeypatch/accelerate/fsdp2.py:539-700,
    installed at :970-973 by loaders/patch_manager.py:344-351) that has no fp32 upcast (accelerate
    1.16.0 utils/fsdp_utils.py:798-806 has one) and passes `MixedPrecisionPolicy()` when none is
    set (:618): bf16 weights, gradients and optimizer states, trainfit's `bf16` precision. FSDP1
    (accelerate's own prepare, which upcasts) and DeepSpeed (fp32 master partitions) keep
    `mixed`. Without FSDP, eager / SDPA attention and no Cut Cross-Entropy, axolotl also leaves
    the embeddings, lm_head and norms in fp32 (loaders/model.py:428-436, :458-476): not
    modelled, reported."""
    if (
        m.setup.get("method") != "full"
        or m.setup.get("precision") != "mixed"
        or not data.get("bf16")
    ):
        return
    if data.get("deepspeed") or (fsdp and _fsdp_version(data) != "2"):
        return
    key = "bf16 + fsdp_version 2" if fsdp else "bf16"
    m.set("precision", "bf16", f"{key} (axolotl loads bf16 weights and keeps them)")
    cast_back = m.setup.get("attention") not in (None, "sdpa", "eager") or any(
        data.get(flag) for flag in ("flex_attention", "xformers_attention")
    )  # utils/schemas/enums.py:159, config.py:1500-1503 `attn_needs_dtype_cast`
    if not fsdp and not cast_back and m.setup.get("loss") != "cce":
        m.ignore(
            "bf16",
            "full fine-tuning without FSDP, Cut Cross-Entropy or a flash / flex attention: "
            "axolotl keeps embed_tokens, lm_head and the norms in fp32 (loaders/model.py:428-436, "
            "458-476); counted in bf16",
        )


def _checkpointing(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    gc = m.get(data, "gradient_checkpointing")
    if gc in ("offload", "offload_disk"):
        m.set("checkpointing", "offload", "gradient_checkpointing")
        if gc == "offload_disk":
            m.ignore("gradient_checkpointing", "offload to disk: counted as offload to host")
    elif gc is not None:
        m.set("checkpointing", "gpu" if gc else "none", "gradient_checkpointing")
    m.get(data, "gradient_checkpointing_kwargs")
    if m.get(data, "selective_checkpointing"):
        m.set("checkpointing", "selective", "selective_checkpointing")
    offload = m.get(data, "activation_offloading")
    if offload:
        m.set("checkpointing", "offload", "activation_offloading")
        if offload == "disk":
            m.ignore("activation_offloading", "offload to disk: counted as offload to host")


def _attention(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    for key, value in ATTENTION_FLAGS:
        if m.get(data, key):
            m.set("attention", value, key)
    for key in ("flex_attention", "xformers_attention"):
        if m.get(data, key):
            m.ignore(key, f"{key.split('_')[0]} attention is not modelled; counted as sdpa")
    map_attention(m, m.get(data, "attn_implementation"), "attn_implementation")


def _loss(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    if m.get(data, "liger_fused_linear_cross_entropy"):
        m.set("loss", "liger", "liger_fused_linear_cross_entropy")
    cce = m.get(data, "cut_cross_entropy")
    if cce or (cce is None and CCE_PLUGIN in _plugins(data)):
        # integrations/cut_cross_entropy/args.py:33 (cut_cross_entropy defaults to True once
        # the plugin is listed) and __init__.py:87-89 (its pre_model_load patches the model)
        m.set("loss", "cce", "cut_cross_entropy" if cce else "plugins (CutCrossEntropyPlugin)")
    if m.get(data, "chunked_cross_entropy"):
        m.set("loss", "chunked", "chunked_cross_entropy")
        chunks = m.get(data, "chunked_cross_entropy_num_chunks")
        if chunks and m.seq_lens:
            m.set(
                "loss_chunk",
                -(-m.seq_lens[0] // whole_number(chunks, "chunked_cross_entropy_num_chunks")),
                "chunked_cross_entropy_num_chunks",
            )
    # axolotl src/axolotl/integrations/liger/plugin.py@8fcba967 passes each flag to Liger's
    # apply function (unset: None, off); Liger's RMSNorm and SwiGLU are modelled together
    # (estimator/memory/liger.py), RoPE keeps nothing per token either way
    norm = m.get(data, "liger_rms_norm")
    glu_keys = [k for k in ("liger_glu_activation", "liger_swiglu") if m.get(data, k)]
    if norm and glu_keys:
        m.set("liger_kernels", True, f"liger_rms_norm + {glu_keys[0]}")
    elif norm or glu_keys:
        key = "liger_rms_norm" if norm else glu_keys[0]
        m.ignore(key, "modelled only with both liger_rms_norm and liger_glu_activation")
    m.get(data, "liger_rope")
    rl = m.get(data, "rl")
    if rl in DPO_RL:
        _dpo(m, data, rl)
    elif rl in ORPO_RL:
        _orpo(m, data, rl)
    elif rl == "kto":
        _kto(m, data)
    elif rl:
        m.ignore(
            "rl",
            f"{rl!r} training (TRL 1.8.0's trainers, axolotl's pin) is {AS_SFT_UNDERESTIMATES}",
        )
    else:  # core/trainers/base.py:72-82, 445-450: AxolotlTrainer(Trainer), the Trainer's loss
        set_trainer_loss(m, "axolotl's AxolotlTrainer (transformers Trainer)")
    for key in ("liger_cross_entropy", "liger_layer_norm", "liger_rms_norm_gated"):
        if m.get(data, key):
            m.ignore(key, "Liger's fused kernel: its activation savings are not modelled")
    for key in KERNEL_FLAGS:
        if m.get(data, key):
            m.ignore(key, "axolotl's fused/tiled kernel: its activation savings are not modelled")
    if m.get(data, "use_kernels"):  # from_pretrained(use_kernels=True), loaders/model.py:225-228
        m.ignore("use_kernels", "transformers' Hub kernels (kernelize): memory not modelled")
    if m.get(data, "resize_token_embeddings_to_32x"):  # loaders/model.py:370-379
        m.ignore(
            "resize_token_embeddings_to_32x",
            "the embedding padded to a multiple of 32 rows when the tokenizer has more: at most "
            "31 rows, not counted",
        )
