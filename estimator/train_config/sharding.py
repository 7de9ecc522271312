"""FSDP and DeepSpeed settings: in a trainer config, a DeepSpeed JSON, or an accelerate config.

Names read from:
- accelerate 1.16.0 `commands/config/cluster.py` lines 245-278 (`deepspeed_config`: `zero_stage`,
  `offload_optimizer_device`, `offload_param_device`, `gradient_accumulation_steps`,
  `deepspeed_config_file`) and 393-497 (`fsdp_config`: `fsdp_version`,
  `fsdp_reshard_after_forward`, `fsdp_offload_params`, `fsdp_activation_checkpointing`, ...);
  `commands/config/config_args.py` lines 78-114 (`distributed_type`, `mixed_precision`,
  `num_processes`); `distributed_type: MULTI_GPU` is DistributedDataParallel (layout `dp`).
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

Each maps to both the legacy `sharding` field and the layout fields of estimator/parallel
(`parallel`: fsdp | hsdp | dp | zero1..3, `reshard_after_forward`, `offload`: optimizer |
params), which model FSDP2 and ZeRO exactly and win when set. FSDP1's SHARD_GRAD_OP is FSDP2
with `reshard_after_forward=False`; FSDP's CPU offload moves parameters, gradients and states
together (`offload: params`); DeepSpeed's `offload_optimizer` is `optimizer`, `offload_param`
(stage 3 only: DeepSpeed's zero/config.py docstring) is `params`.
"""

from __future__ import annotations

from typing import Any

from estimator.train_config.result import TrainConfigMapping

# FSDP1 ShardingStrategy (name or accelerate's number) -> (legacy sharding, layout, reshard)
FSDP_STRATEGIES: dict[str, tuple[str, str, bool]] = {
    "FULL_SHARD": ("fsdp", "fsdp", True),
    "1": ("fsdp", "fsdp", True),
    "SHARD_GRAD_OP": ("zero2", "fsdp", False),
    "2": ("zero2", "fsdp", False),
    "NO_SHARD": ("none", "dp", True),
    "3": ("none", "dp", True),
    "HYBRID_SHARD": ("fsdp", "hsdp", True),
    "4": ("fsdp", "hsdp", True),
    "_HYBRID_SHARD_ZERO2": ("zero2", "hsdp", False),
    "5": ("zero2", "hsdp", False),
}
ZERO_STAGES = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}
NVME_REASON = "offload to NVMe: counted as offload to host memory (the GPU side is the same)"


def set_layout(
    m: TrainConfigMapping, sharding: str, layout: str, key: str, reshard: bool = True
) -> None:
    """The legacy `sharding` field and the estimator/parallel layout for the same setting."""
    m.set("sharding", sharding, key)
    m.set("parallel", layout, key)
    if not reshard or "reshard_after_forward" in m.setup:  # True is the default
        m.set("reshard_after_forward", reshard, key)


def set_offload(m: TrainConfigMapping, what: str, key: str) -> None:
    """`offload`: `params` (FSDP CPU offload, ZeRO-3 offload_param) wins over `optimizer`."""
    if m.setup.get("offload") != "params":
        m.set("offload", what, key)


def map_fsdp_words(m: TrainConfigMapping, value: object, key: str) -> None:
    """transformers' `fsdp: "full_shard auto_wrap offload"` (a string or a list of words)."""
    items = value if isinstance(value, list) else []
    words = value.split() if isinstance(value, str) else [str(v) for v in items]
    words = [w.lower() for w in words]
    if "full_shard" in words:
        set_layout(m, "fsdp", "fsdp", key)
    elif "shard_grad_op" in words:
        set_layout(m, "zero2", "fsdp", key, reshard=False)
    elif "hybrid_shard" in words:
        set_layout(m, "fsdp", "hsdp", key)
    elif "hybrid_shard_zero2" in words:
        set_layout(m, "zero2", "hsdp", key, reshard=False)
    if "offload" in words:
        set_offload(m, "params", key + ":offload")


def map_fsdp_dict(
    m: TrainConfigMapping, data: dict[str, Any], prefix: str, version: object = None
) -> None:
    """An FSDP config dict, keys with or without the `fsdp_` prefix (accelerate / axolotl / HF);
    `version`: the FSDP version given beside it (axolotl's top-level `fsdp_version`)."""

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
            set_layout(m, mapped[0], mapped[1], key, reshard=mapped[2])
    elif "sharding" not in m.setup:
        set_layout(m, "fsdp", "fsdp", prefix.rstrip(".") or "fsdp_config")
    reshard, key = get("reshard_after_forward")
    if reshard is False or str(reshard).upper() == "SHARD_GRAD_OP":
        set_layout(m, "zero2", str(m.setup.get("parallel", "fsdp")), key, reshard=False)
    offload, key = get("offload_params")
    if offload:
        set_offload(m, "params", key)
    checkpointing, key = get("activation_checkpointing")
    if checkpointing is not None:
        m.set("checkpointing", "gpu" if checkpointing else "none", key)
    for name in ("version", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "state_dict_type"):
        get(name)
    for name in ("cpu_ram_efficient_loading", "sync_module_states", "use_orig_params"):
        get(name)
    # FSDP1's rate limiter: at most two layers' all-gathers in flight (torch 2.13
    # distributed/fsdp/fully_sharded_data_parallel.py:351-360, default True at :411; accelerate
    # 1.16.0 utils/dataclasses.py:1629), what the gathered-layer terms assume; off, more layers
    # may be gathered at once
    limit, key = get("limit_all_gathers")
    if limit is False or str(limit).lower() == "false":
        m.ignore(key, "unlimited all-gathers in flight are not modelled (more gathered layers)")
    _backward_prefetch(m, *get("backward_prefetch"), get("version")[0] or version)
    m.warn_unread(data, prefix)


def _backward_prefetch(m: TrainConfigMapping, value: object, key: str, version: object) -> None:
    """FSDP1's backward prefetch (torch 2.13 distributed/fsdp/api.py:78-94): BACKWARD_PRE holds
    the current and the next unit's parameters at the backward's peak, the two gathered units
    the estimate counts (as FSDP2 prefetches); BACKWARD_POST frees the current unit first and
    NO_PREFETCH (accelerate's None) fetches none, one unit each. accelerate 1.16.0 drops the key
    under FSDP2 (utils/dataclasses.py:1769-1780)."""
    if value is None or str(version) == "2":
        return
    if str(value).upper() in ("BACKWARD_POST", "NO_PREFETCH"):
        m.ignore(
            key,
            f"{value}: one gathered unit at the backward's peak; priced with the next one "
            "prefetched (two), an overestimate of one unit's parameters",
        )


def _zero_stage(m: TrainConfigMapping, stage: object, key: str) -> int | None:
    if isinstance(stage, int) and stage in ZERO_STAGES:
        set_layout(m, ZERO_STAGES[stage], ZERO_STAGES[stage] if stage else "dp", key)
        return stage
    if stage is not None:
        m.ignore(key, f"ZeRO stage {stage!r} is not 0-3")
    return None


def _zero_offload(
    m: TrainConfigMapping, stage: int | None, part: str, device: object, key: str
) -> None:
    """`part` is `optimizer` or `param`; `device` none | cpu | nvme."""
    if device in (None, "none"):
        return
    if part == "param" and stage != 3:
        m.ignore(key, "DeepSpeed offloads parameters only with ZeRO stage 3")
        return
    if stage in (None, 0):
        m.ignore(key, "offload needs ZeRO stage 1-3")
        return
    set_offload(m, "params" if part == "param" else "optimizer", key)
    if device == "nvme":
        m.ignore(key, NVME_REASON)


# ZeRO's buffer sizes (elements) at DeepSpeed's defaults, which estimator/parallel/data.py models
# (deepspeedai/DeepSpeed@1b88ac36 deepspeed/runtime/zero/config.py; sub_group_size: the config
# JSON docs, default 1e9): another number changes the buffers, so it is listed as ignored.
ZERO_BUFFER_DEFAULTS = {
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_max_live_parameters": 1e9,
    "stage3_param_persistence_threshold": 1e5,
    "sub_group_size": 1e9,
}
# ZeRO switches that move no memory the estimate counts (communication overlap, layout of the
# gradient buffer, what is saved at the end)
ZERO_NO_MEMORY = (
    "overlap_comm",
    "contiguous_gradients",
    "round_robin_gradients",
    "reduce_scatter",
    "allgather_partitions",
    "stage3_gather_16bit_weights_on_model_save",
    "gather_16bit_weights_on_model_save",
)


def _zero_buffers(m: TrainConfigMapping, zero: dict[str, Any], zp: str) -> None:
    for name, default in ZERO_BUFFER_DEFAULTS.items():
        value = m.get(zero, name, zp)
        if isinstance(value, int | float) and not isinstance(value, bool) and value != default:
            m.ignore(zp + name, f"{value:g}: trainfit models DeepSpeed's default {default:g}")
    for name in ZERO_NO_MEMORY:
        m.get(zero, name, zp)
    m.warn_unread(zero, zp)


def map_deepspeed(m: TrainConfigMapping, data: dict[str, Any], prefix: str = "") -> None:
    """A DeepSpeed config JSON object."""
    m.set("stack", "deepspeed", prefix + "zero_optimization")
    # read, no memory effect: checks on which optimizer the engine accepts (DeepSpeed
    # edaa72212 runtime/engine.py:1989-1990 an untested optimizer under ZeRO, :2042-2043 a
    # client optimizer with ZeRO-Offload)
    for name in ("zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"):
        m.get(data, name, prefix)
    zero = m.get(data, "zero_optimization", prefix)
    if isinstance(zero, dict):
        zp = prefix + "zero_optimization."
        stage = _zero_stage(m, m.get(zero, "stage", zp), zp + "stage")
        for part in ("optimizer", "param"):
            section = m.get(zero, f"offload_{part}", zp)
            device = section.get("device") if isinstance(section, dict) else None
            _zero_offload(m, stage, part, device, f"{zp}offload_{part}.device")
        _zero_buffers(m, zero, zp)
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
    if kind == "NO":
        # one process, whatever num_processes says: with a config file, `accelerate launch`
        # takes multi_gpu / use_fsdp / use_deepspeed from distributed_type only and then runs
        # simple_launcher (accelerate 1.16.0 commands/launch.py:1270-1295, 1420-1440)
        m.set("num_gpus", 1, "distributed_type (NO: one process)")
        if isinstance(processes, int) and processes > 1:
            m.ignore("num_processes", "distributed_type NO runs one process")
    elif isinstance(processes, int) and processes >= 1:
        m.set("num_gpus", processes, "num_processes")
    # read, no effect on memory: bf16 -> fp16 downcasting on TPUs only (utils/launch.py:561-562,
    # state.py:927-933); DeepSpeed's multi-node launcher (utils/launch.py:420-422)
    m.get(data, "downcast_bf16")
    precision = m.get(data, "mixed_precision")
    if precision in ("bf16", "fp16"):
        m.set("autocast", True, "mixed_precision")
        m.set("precision", "mixed", "mixed_precision")
    if kind == "MULTI_GPU":  # DistributedDataParallel: every card holds the whole model
        set_layout(m, "none", "dp", "distributed_type")
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
    stage = _zero_stage(m, m.get(ds, "zero_stage", p), p + "zero_stage")
    for part in ("optimizer", "param"):
        name = f"offload_{part}_device"
        _zero_offload(m, stage, part, m.get(ds, name, p), p + name)
    accum = m.get(ds, "gradient_accumulation_steps", p)
    if isinstance(accum, int):
        m.set("grad_accum", accum, p + "gradient_accumulation_steps")
    # loading and saving only; the multi-node launcher (accelerate utils/launch.py:420-422)
    for name in ("zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher"):
        m.get(ds, name, p)
    if m.get(ds, "deepspeed_config_file", p):
        m.warnings.append(
            f"{p}deepspeed_config_file: pass that JSON as a second --train-config to read it"
        )
    m.warn_unread(ds, p)
