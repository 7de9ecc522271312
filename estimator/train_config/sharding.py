"""FSDP and DeepSpeed settings: in a trainer config, a DeepSpeed JSON, or an accelerate config.

Names read from:
- accelerate 1.16.0 `commands/config/cluster.py` lines 245-278 (`deepspeed_config`: `zero_stage`,
  `offload_optimizer_device`, `offload_param_device`, `gradient_accumulation_steps`,
  `deepspeed_config_file`) and 393-497 (`fsdp_config`: `fsdp_version`,
  `fsdp_reshard_after_forward`, `fsdp_offload_params`, `fsdp_activation_checkpointing`, ...);
  `commands/config/config_args.py` lines 78-114 (`distributed_type`, `mixed_precision`,
  `num_processes`).
- axolotl 067b021c `src/axolotl/utils/schemas/fsdp.py` (the same keys without the `fsdp_` prefix:
  `offload_params`, `activation_checkpointing`, `reshard_after_forward`, `fsdp_version`).
- transformers 5.24.0 `training_args.py` line 1447 (`fsdp`: words such as `full_shard`,
  `shard_grad_op`, `hybrid_shard`, `offload`, `auto_wrap`).
- PyTorch FSDP `ShardingStrategy` docs: FULL_SHARD shards parameters, gradients and optimizer
  states (ZeRO-3); SHARD_GRAD_OP shards gradients and optimizer states, parameters stay whole
  outside forward/backward (ZeRO-2); NO_SHARD is DDP; FSDP2 `reshard_after_forward=False` keeps
  gathered parameters between forward and backward, the SHARD_GRAD_OP behaviour.
- DeepSpeed config JSON docs (deepspeed.ai/docs/config-json): `zero_optimization.stage`,
  `zero_optimization.offload_optimizer.device`, `offload_param.device`,
  `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps`, `bf16.enabled`,
  `fp16.enabled`, `optimizer.type`, `activation_checkpointing.partition_activations` and
  `cpu_checkpointing`. `"auto"` values are filled in by the HF integration from the trainer's
  arguments, so they are skipped here.
"""

from __future__ import annotations

from typing import Any

from estimator.train_config.result import TrainConfigMapping

FSDP_STRATEGIES = {
    "FULL_SHARD": "fsdp",
    "1": "fsdp",
    "SHARD_GRAD_OP": "zero2",
    "2": "zero2",
    "NO_SHARD": "none",
    "3": "none",
    "HYBRID_SHARD": "fsdp",
    "4": "fsdp",
    "_HYBRID_SHARD_ZERO2": "zero2",
    "5": "zero2",
}
ZERO_STAGES = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}
OFFLOAD_REASON = "CPU/NVMe offload of {what} is not modelled (GPU bytes are an upper bound)"


def map_fsdp_words(m: TrainConfigMapping, value: object, key: str) -> None:
    """transformers' `fsdp: "full_shard auto_wrap offload"` (a string or a list of words)."""
    items = value if isinstance(value, list) else []
    words = value.split() if isinstance(value, str) else [str(v) for v in items]
    words = [w.lower() for w in words]
    if "full_shard" in words or "hybrid_shard" in words:
        m.set("sharding", "fsdp", key)
    elif "shard_grad_op" in words or "hybrid_shard_zero2" in words:
        m.set("sharding", "zero2", key)
    if "offload" in words:
        m.ignore(key + ":offload", OFFLOAD_REASON.format(what="FSDP parameters and gradients"))


def map_fsdp_dict(m: TrainConfigMapping, data: dict[str, Any], prefix: str) -> None:
    """An FSDP config dict, keys with or without the `fsdp_` prefix (accelerate / axolotl / HF)."""

    def get(name: str) -> tuple[Any, str]:
        for k in (f"fsdp_{name}", name):
            if k in data:
                return m.get(data, k, prefix), prefix + k
        return None, prefix + name

    strategy, key = get("sharding_strategy")
    if strategy is not None:
        mapped = FSDP_STRATEGIES.get(str(strategy).upper())
        if mapped is None:
            m.ignore(key, f"sharding strategy {strategy!r} is not known")
        else:
            m.set("sharding", mapped, key)
    elif "sharding" not in m.setup:
        m.set("sharding", "fsdp", prefix.rstrip(".") or "fsdp_config")
    reshard, key = get("reshard_after_forward")
    if reshard is False or str(reshard).upper() == "SHARD_GRAD_OP":
        m.set("sharding", "zero2", key)
    offload, key = get("offload_params")
    if offload:
        m.ignore(key, OFFLOAD_REASON.format(what="FSDP parameters, gradients and optimizer"))
    checkpointing, key = get("activation_checkpointing")
    if checkpointing is not None:
        m.set("checkpointing", "gpu" if checkpointing else "none", key)
    for name in ("version", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "state_dict_type"):
        get(name)
    for name in ("cpu_ram_efficient_loading", "sync_module_states", "use_orig_params"):
        get(name)
    m.warn_unread(data, prefix)


def map_deepspeed(m: TrainConfigMapping, data: dict[str, Any], prefix: str = "") -> None:
    """A DeepSpeed config JSON object."""
    m.set("stack", "deepspeed", prefix + "zero_optimization")
    zero = m.get(data, "zero_optimization", prefix)
    if isinstance(zero, dict):
        zp = prefix + "zero_optimization."
        stage = m.get(zero, "stage", zp)
        if isinstance(stage, int) and stage in ZERO_STAGES:
            m.set("sharding", ZERO_STAGES[stage], zp + "stage")
        elif stage is not None:
            m.ignore(zp + "stage", f"ZeRO stage {stage!r} is not 0-3")
        for part, what in (("offload_optimizer", "optimizer states"), ("offload_param", "params")):
            section = m.get(zero, part, zp)
            device = section.get("device") if isinstance(section, dict) else None
            if device not in (None, "none"):
                m.ignore(f"{zp}{part}.device", OFFLOAD_REASON.format(what=what) + f" ({device})")
    batch = m.get(data, "train_micro_batch_size_per_gpu", prefix)
    if isinstance(batch, int):
        m.set("batch", batch, prefix + "train_micro_batch_size_per_gpu")
    accum = m.get(data, "gradient_accumulation_steps", prefix)
    if isinstance(accum, int):
        m.set("grad_accum", accum, prefix + "gradient_accumulation_steps")
    for name in (
        "train_batch_size",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
    ):
        m.get(data, name, prefix)
    for name in ("bf16", "fp16"):
        section = m.get(data, name, prefix)
        if isinstance(section, dict) and section.get("enabled") is True:
            # DeepSpeed's bf16/fp16 mode: 16-bit weights with fp32 master copies in the optimizer
            m.set("precision", "mixed", f"{prefix}{name}.enabled")
            m.set("autocast", False, f"{prefix}{name}.enabled")
    optimizer = m.get(data, "optimizer", prefix)
    if isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        m.set("optimizer", "adamw", prefix + "optimizer.type")
    elif isinstance(optimizer, dict):
        m.ignore(prefix + "optimizer.type", f"optimizer {optimizer.get('type')!r} not modelled")
    act = m.get(data, "activation_checkpointing", prefix)
    if isinstance(act, dict) and act.get("cpu_checkpointing"):
        m.set("checkpointing", "offload", prefix + "activation_checkpointing.cpu_checkpointing")
    m.warn_unread(data, prefix)


def read_deepspeed(data: dict[str, Any]) -> TrainConfigMapping:
    m = TrainConfigMapping("deepspeed")
    map_deepspeed(m, data)
    return m


def read_accelerate(data: dict[str, Any]) -> TrainConfigMapping:
    """An accelerate config YAML (`accelerate config` / `accelerate launch --config_file`)."""
    m = TrainConfigMapping("accelerate")
    kind = str(m.get(data, "distributed_type") or "NO").upper()
    processes = m.get(data, "num_processes")
    if isinstance(processes, int) and processes >= 1:
        m.set("num_gpus", processes, "num_processes")
    precision = m.get(data, "mixed_precision")
    if precision in ("bf16", "fp16"):
        m.set("autocast", True, "mixed_precision")
        m.set("precision", "mixed", "mixed_precision")
    fsdp = m.get(data, "fsdp_config")
    if kind == "FSDP" and isinstance(fsdp, dict):
        map_fsdp_dict(m, fsdp, "fsdp_config.")
    ds = m.get(data, "deepspeed_config")
    if kind == "DEEPSPEED" and isinstance(ds, dict):
        _map_accelerate_deepspeed(m, ds)
    m.warn_unread(data)
    return m


def _map_accelerate_deepspeed(m: TrainConfigMapping, ds: dict[str, Any]) -> None:
    p = "deepspeed_config."
    m.set("stack", "deepspeed", p + "zero_stage")
    stage = m.get(ds, "zero_stage", p)
    if isinstance(stage, int) and stage in ZERO_STAGES:
        m.set("sharding", ZERO_STAGES[stage], p + "zero_stage")
    for name, what in (
        ("offload_optimizer_device", "optimizer states"),
        ("offload_param_device", "params"),
    ):
        device = m.get(ds, name, p)
        if device not in (None, "none"):
            m.ignore(p + name, OFFLOAD_REASON.format(what=what) + f" ({device})")
    accum = m.get(ds, "gradient_accumulation_steps", p)
    if isinstance(accum, int):
        m.set("grad_accum", accum, p + "gradient_accumulation_steps")
    if m.get(ds, "deepspeed_config_file", p):
        m.warnings.append(
            f"{p}deepspeed_config_file: pass that JSON as a second --train-config to read it"
        )
    m.warn_unread(ds, p)
