"""`trainfit-probe --stack torchtitan`: torchtitan's own `Trainer` runs the steps.

    torchrun --standalone --nproc-per-node 2 -m probe --stack torchtitan --device cpu \
        --config tests/data/configs/small-llama-parallel.json --sweep 256 --steps 2

What runs is the library's code: `torchtitan.trainer.Trainer.__init__` (its ParallelDims and
device mesh, the llama3 model built on meta and materialised by its `init_weights`, its
`parallelize_llama`: activation checkpointing then FSDP2 `fully_shard` per block with
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, its `build_optimizers` (AdamW,
fused or foreach), its cross-entropy loss) and `Trainer.train_step` (zero_grad, forward,
loss, `del pred`, backward, `clip_grad_norm_`, optimizer and LR-scheduler step). The probe
adds no training logic; it supplies what a user's job supplies (the model config, the data,
the tokenizer) and observes memory.

Memory: probe.cpu_memory's counting wrapper in front of c10's CPU allocator (as
probe.parallel_check): every block from before the Trainer is built, freed on any thread (gloo's
workers included) and through storage resizes (FSDP2 frees all-gathered parameters that way,
which the storage tracker would not see). Phases end where the model returns its output (a
forward hook) and where the optimizer step starts and ends (optimizer step hooks). What stood
in for a GPU run is listed in the memtest's `environment.substituted` (`SUBSTITUTED`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import torch

from memtest_schema import SCHEMA_ID, validate_memtest
from probe import __version__
from probe.environment import describe_environment, package_version
from probe.options import ProbeInputError

__all__ = [
    "LIBRARIES",
    "SUBSTITUTED",
    "check_torchtitan_setup",
    "torchtitan_setup",
    "run_torchtitan",
    "torchtitan_model_config",
]

LIBRARIES = ("torchtitan", "torch", "spmd_types", "torchdata", "tyro", "triton")

# torchtitan 0.3.0's default `parallelism.spmd_backend` is "spmd_types": parameters stay plain
# tensors annotated by spmd_types and fully_shard(dp_mesh_dims=...) is expected to turn them into
# DTensors (distributed/full_dtensor.py:86-91). torch 2.13.0's fully_shard does not: with 2 ranks
# it raises "When dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD
# mesh" (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:345). "partial_dtensor" (DTensor
# for model-parallel axes only; FSDP2 on the dp mesh without dp_mesh_dims) is the option of the
# same release that runs; it is used for every world size so 1 and N ranks run the same path.
SPMD_BACKEND = "partial_dtensor"  # the same marker sizes as probe.parallel_check

# Always substituted on this machine (the data, the tokenizer, the device): see run_torchtitan.
SUBSTITUTED = [
    "device: torchtitan picks 'cuda' when torch finds no accelerator "
    "(torchtitan/tools/utils.py:55 `_get_available_device_type() or 'cuda'`), so the probe sets "
    "torchtitan's device_type to 'cpu' and its device_module to a CPU stand-in whose memory "
    "statistics are empty (the Trainer's own memory monitor logs -1 GiB; the probe's counter "
    "measures); torch.distributed then uses gloo (Backend.default_device_backend_map['cpu'])",
    "data: random token ids from the probe's BaseDataLoader subclass (batch x seq, labels the "
    "inputs shifted by one) instead of HuggingFaceTextDataLoader over a downloaded dataset",
    "tokenizer: a BaseTokenizer subclass that only reports the config's vocab size (no "
    "tokenizer files; the random-token data never encodes text)",
    "attention: torchtitan's own ScaledDotProductAttention module (causal SDPA; the CPU "
    "flash-attention kernel) instead of llama3's default FlexAttention, whose torch.compile'd "
    "flex_attention and block masks would need inductor's C++ compile here; the inputs carry no "
    "document positions, so causal SDPA masks exactly what the block-causal mask would",
    "cuda graphs: training.disable_cuda_graphs=True (CUDA-only)",
    "FSDP2 reduce-scatter: ReduceOp.SUM (set_force_sum_reduction_for_comms(True) on each "
    "FSDP module after the Trainer is built) instead of the PREMUL_SUM(1.0) that torchtitan's "
    "gradient_divide_factor=1.0 makes torch 2.13 pick, which gloo cannot run (2+ ranks only; "
    "the same sums on the same buffers)",
    "parallelism.spmd_backend='partial_dtensor' instead of the default 'spmd_types': with torch "
    "2.13.0, fully_shard(dp_mesh_dims=...) rejects spmd_types' annotated plain parameters at 2 "
    "ranks (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:345); partial_dtensor is the "
    "same release's FSDP2-on-the-dp-mesh path",
    "torch.distributed.set_timeout, which torchtitan 0.3.0 calls after the first step "
    "(distributed/utils.py:595 set_pg_timeouts), is not in torch 2.13.0: the probe makes it "
    "torch 2.13's torch.distributed.distributed_c10d._set_pg_timeout (same arguments) while "
    "the Trainer runs",
    "collective release: after each synchronous c10d collective the probe waits until gloo's "
    "worker thread has dropped its reference to the collective's tensors "
    "(probe/collective_settle.py; ProcessGroupGloo.hpp:485-492), so that they are freed on the "
    "calling thread in program order, as NCCL releases them at the stream sync "
    "(ProcessGroupNCCL.hpp:485-495); the wait counts are in the memtest's notes",
    "memory: c10 CPU allocator blocks counted by probe.cpu_memory (every thread, storage "
    "resizes included) stand in for the CUDA caching allocator's max_memory_allocated; no "
    "reserved bytes; buffers gloo keeps outside c10 are not counted (as NCCL's are outside "
    "torch's); the blocks gloo's worker threads allocate through c10 are counted in the peak "
    "and also reported apart (trace_other_threads)",
]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def torchtitan_setup(setup: dict[str, Any] | None) -> dict[str, Any]:
    """The normalised setup with torchtitan's defaults where the user gave none: no autocast
    (FSDP2's MixedPrecisionPolicy casts), fused AdamW (components/optimizer/optimizer.py:109-111),
    selective (per-op) activation checkpointing is torchtitan's default (trainer.py:108-110) but
    the probe keeps the setup's own default unless told."""
    from probe.options import normalize_setup

    given = {**(setup or {}), "stack": "torchtitan"}
    if given.get("autocast") is None:
        given["autocast"] = False
    if given.get("optimizer_impl") is None:
        given["optimizer_impl"] = "fused"
    return normalize_setup(given)


def check_torchtitan_setup(setup: dict[str, Any], device: str) -> None:
    """Raise `ProbeInputError` naming the field for what torchtitan's Trainer cannot run here."""
    if device not in ("cpu", "fake"):
        raise ProbeInputError(
            "device",
            f"--stack torchtitan runs on cpu or fake here (got {device}): on a CUDA machine "
            "run torchtitan's own train.py with its memory monitor",
        )
    fixed: dict[str, Any] = {
        "method": ("full", "torchtitan's Trainer trains all weights"),
        "optimizer": ("adamw", "the probe drives torchtitan's default AdamW"),
        "attention": ("sdpa", "causal SDPA (see environment.substituted)"),
        "lora_dropout": (0.0, "no LoRA in torchtitan's llama3 trainer"),
        "paged": (False, "no bitsandbytes in torchtitan"),
        "double_quant": (False, "no bitsandbytes in torchtitan"),
    }
    for key, (value, why) in fixed.items():
        if setup[key] != value:
            raise ProbeInputError(f"setup.{key}", f"{why}: only {value!r}, got {setup[key]!r}")
    if setup["autocast"]:
        raise ProbeInputError(
            "setup.autocast",
            "torchtitan casts through FSDP2's MixedPrecisionPolicy, not torch.autocast",
        )
    if setup["checkpointing"] == "offload":
        raise ProbeInputError(
            "setup.checkpointing",
            "torchtitan has none, full (gpu) or selective activation checkpointing",
        )
    if setup["loss"] != "full":
        raise ProbeInputError(
            "setup.loss", "the probe drives torchtitan's CrossEntropyLoss (full logits)"
        )
    if setup["optimizer_impl"] == "in-backward":
        raise ProbeInputError(
            "setup.optimizer_impl", "torchtitan's OptimizersContainer: fused or foreach"
        )
    if importlib_find("torchtitan") is None:
        raise ProbeInputError(
            "setup.stack",
            "torchtitan is not installed (pip install -e '.[torchtitan]' after torch 2.13)",
        )


def importlib_find(name: str) -> Any:
    import importlib.util

    return importlib.util.find_spec(name)


# ---------------------------------------------------------------------------------------------
# what a user's job supplies: model config, tokenizer, data


def torchtitan_model_config(config: dict[str, Any]) -> Any:
    """A torchtitan `Llama3Model.Config` for an HF llama config.json, built with torchtitan's
    own layer builder (models/llama3/__init__.py `_build_llama3_layers`, as its `_debugmodel`
    flavor does) and its ScaledDotProductAttention as the inner attention."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (  # its private builders: what its flavors call
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    if config.get("model_type") != "llama":
        raise ProbeInputError(
            "config.model_type",
            "--stack torchtitan builds torchtitan's llama3 model; got "
            f"{config.get('model_type')!r}",
        )
    dim = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    vocab = int(config["vocab_size"])
    head_dim = int(config.get("head_dim") or dim // heads)
    if head_dim * heads != dim:
        raise ProbeInputError("config.head_dim", "torchtitan's llama3 needs head_dim = dim / heads")
    tied = bool(config.get("tie_word_embeddings", False))
    rope = ComplexRoPE.Config(
        dim=head_dim,
        max_seq_len=int(config.get("max_position_embeddings") or 4096),
        theta=float(config.get("rope_theta") or 10000.0),
        scaling="none",
    )
    layers = _build_llama3_layers(
        n_layers=int(config["num_hidden_layers"]),
        dim=dim,
        n_heads=heads,
        n_kv_heads=kv,
        hidden_dim=int(config["intermediate_size"]),
        rope=rope,
        fuse_qkv=True,
        attn_backend="flex",
    )
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)
        ),
        layers=layers,
    )


def _tokenizer_class() -> type:
    from torchtitan.components.tokenizer import BaseTokenizer

    class VocabOnlyTokenizer(BaseTokenizer):  # type: ignore[misc]  # torchtitan has no types
        """Reports the vocabulary size; the probe's data are token ids, never text."""

        def __init__(self, config: Any = None, *, tokenizer_path: str = "", vocab: int = 0):
            super().__init__()
            self.vocab = vocab

        def encode(self, *args: Any, **kwargs: Any) -> list[int]:
            raise NotImplementedError("the probe feeds token ids")

        def decode(self, *args: Any, **kwargs: Any) -> str:
            raise NotImplementedError("the probe feeds token ids")

        def get_vocab_size(self) -> int:
            return self.vocab

    return VocabOnlyTokenizer


def _dataloader_class() -> type:
    from torchtitan.components.dataloader import BaseDataLoader

    class RandomTokens(BaseDataLoader):  # type: ignore[misc]  # torchtitan has no types
        """`({"input": ids}, labels)` batches of random token ids, as torchtitan's text
        dataloaders yield them (hf_datasets/text_datasets.py: labels are the inputs shifted by
        one); seeded by the data-parallel rank."""

        def __init__(
            self, *, vocab: int, seq_len: int, local_batch_size: int, dp_rank: int
        ) -> None:
            self.vocab, self.seq_len, self.batch = vocab, seq_len, local_batch_size
            self.generator = torch.Generator().manual_seed(1000 + dp_rank)

        def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
            while True:
                ids = torch.randint(
                    0, self.vocab, (self.batch, self.seq_len + 1), generator=self.generator
                )
                yield {"input": ids[:, :-1].contiguous()}, ids[:, 1:].contiguous()

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            return None

    return RandomTokens


# ---------------------------------------------------------------------------------------------
# the CPU device for torchtitan


class _CpuProperties:
    name = "cpu"

    def __init__(self) -> None:
        self.total_memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cpu_device_module() -> types.ModuleType:
    """torch.cpu with the few torch.cuda calls torchtitan's Trainer and memory monitor make
    (components/metrics.py:39-93): names and capacity of the machine, empty memory stats."""
    module = types.ModuleType("trainfit_torchtitan_cpu")
    for name in ("set_device", "synchronize", "device_count", "is_available"):
        setattr(module, name, getattr(torch.cpu, name))
    # an index, as torch.cuda's: utils.py:586 passes it to barrier(device_ids=[...])
    module.current_device = lambda: 0  # type: ignore[attr-defined]
    module.get_device_name = lambda device=None: "cpu"  # type: ignore[attr-defined]
    module.get_device_properties = lambda device=None: _CpuProperties()  # type: ignore[attr-defined]
    module.memory_stats = lambda device=None: {}  # type: ignore[attr-defined]
    module.reset_peak_memory_stats = lambda device=None: None  # type: ignore[attr-defined]
    module.empty_cache = lambda: None  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def _torchtitan_on_cpu() -> Iterator[None]:
    """Point every loaded torchtitan module's `device_type`/`device_module` at the CPU."""
    import torchtitan.trainer  # noqa: F401  (imports the modules that bind the names)
    from torchtitan.tools import utils

    cpu = _cpu_device_module()
    saved: list[tuple[Any, str, Any]] = []
    for mod in list(sys.modules.values()):
        name = getattr(mod, "__name__", "")
        if not name.startswith("torchtitan"):
            continue
        for attr in ("device_type", "device_module"):
            if attr in vars(mod) and (mod is utils or vars(mod)[attr] is vars(utils)[attr]):
                saved.append((mod, attr, vars(mod)[attr]))
    for mod, attr, _ in saved:
        setattr(mod, attr, "cpu" if attr == "device_type" else cpu)
    import torch.distributed as dist

    added_timeout = not hasattr(dist, "set_timeout")
    if added_timeout:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = _set_pg_timeout  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)
        if added_timeout:
            del dist.set_timeout  # type: ignore[attr-defined]


@contextlib.contextmanager
def _torchrun_env() -> Iterator[bool]:
    """torchtitan reads torchrun's variables (LOCAL_RANK, ...). Outside torchrun the probe runs
    as `torchrun --nproc-per-node 1` would: rank 0 of 1 on a free local port."""
    if "LOCAL_RANK" in os.environ:
        yield False
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield True
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# the job


def _trainer_config(config: dict[str, Any], setup: dict[str, Any], seq: int, steps: int) -> Any:
    """torchtitan's `Trainer.Config`, as a user's job file (config_registry.py) writes it."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.llama3 import parallelize_llama
    from torchtitan.protocols.model_spec import ModelSpec
    from torchtitan.trainer import Trainer

    model = torchtitan_model_config(config)
    spec = ModelSpec(
        name="llama3",
        flavor="trainfit-probe",
        model=model,
        parallelize_fn=parallelize_llama,
        pipelining_fn=None,
        post_optimizer_build_fn=None,
        state_dict_adapter=None,
    )
    dtype = "bfloat16" if setup["precision"] == "bf16" else "float32"
    mp_param = "float32" if setup["precision"] == "fp32" else "bfloat16"
    ac: Any = {
        "none": None,
        "gpu": FullAC.Config(),
        "selective": SelectiveAC.Config(),
    }[setup["checkpointing"]]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch = int(setup["batch"])
    tokenizer_cls = _tokenizer_class()
    loader_cls = _dataloader_class()
    vocab = int(config["vocab_size"])
    optimizer = default_adamw(lr=8e-4)
    optimizer.implementation = setup["optimizer_impl"] or "fused"
    cfg = Trainer.Config(
        model_spec=spec,
        hf_assets_path="",
        dump_folder=os.environ.get("TMPDIR", "/tmp") + "/trainfit-torchtitan",
        loss=CrossEntropyLoss.Config(global_vocab_size=vocab),
        optimizer=optimizer,
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1),
        training=TrainingConfig(
            local_batch_size=batch,
            global_batch_size=batch * world * int(setup["grad_accum"] or 1),
            seq_len=seq,
            steps=steps,
            dtype=dtype,
            mixed_precision_param=mp_param,
            disable_cuda_graphs=True,
        ),
        metrics=MetricsProcessor.Config(log_freq=10**9),
        # SPMD_BACKEND: the default spmd_types fails under FSDP > 1 with torch 2.13.0
        parallelism=ParallelismConfig(spmd_backend=SPMD_BACKEND),
        checkpoint=CheckpointManager.Config(enable=False),
        activation_checkpoint=ac,
        compile=CompileConfig(enable=False),
    )
    # the user's tokenizer and dataloader slots, filled with the probe's stand-ins
    cfg.tokenizer = _configurable(tokenizer_cls, vocab=vocab)
    cfg.dataloader = _configurable(loader_cls, vocab=vocab)
    return cfg


def _configurable(cls: type, **bound: Any) -> Any:
    """A `Configurable.Config` whose `build(**kwargs)` makes `cls` (torchtitan's Trainer calls
    `config.tokenizer.build(tokenizer_path=...)`, `config.dataloader.build(dp_rank=..., ...)`)."""

    class _Config:
        def build(self, **kwargs: Any) -> Any:
            if cls.__name__ == "RandomTokens":
                return cls(
                    vocab=bound["vocab"],
                    seq_len=kwargs["seq_len"],
                    local_batch_size=kwargs["local_batch_size"],
                    dp_rank=kwargs["dp_rank"],
                )
            return cls(vocab=bound["vocab"])

        def to_dict(self) -> dict[str, Any]:
            return {"probe_stand_in": cls.__name__}

    return _Config()


def _local_bytes(tensors: Any) -> int:
    """Bytes of the local storage of each tensor (a DTensor's shard), each storage once."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        key = storage._cdata  # not data_ptr(): a fake tensor's storage has none
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def _state_tensors(optimizers: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for opt in optimizers.optimizers:
        for state in opt.state.values():
            out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out


def _hook_phases(
    trainer: Any, resident: dict[str, int], ends: list[float], phase: Any, current: Any = None
) -> list[Any]:
    """Phase ends at the model's output (a forward hook), the optimizer step's start (backward
    and loss done) and its end; at the step's end the resident weights, gradients and
    optimizer states are measured from the tensors and the time is taken (`ends`). With
    `current` (the counter's bytes now), the model's output hook also records the bytes alive
    then (`at_output`), the output's own bytes (`output`) and the buffers' (`buffers`): what
    the forward keeps for the backward is at_output - params - optimizer - output - buffers
    (no gradients then: zero_grad(set_to_none=True) ran before the forward)."""
    model = trainer.model_parts[0]
    opts = trainer.optimizers.optimizers

    def params() -> list[torch.Tensor]:
        return [p for m in trainer.model_parts for p in m.parameters()]

    def at_output(module: Any, args: Any, output: Any) -> None:
        phase("forward")
        if current is None:
            return
        resident["at_output"] = int(current())
        resident["output"] = _local_bytes([output] if isinstance(output, torch.Tensor) else [])
        resident["buffers"] = _local_bytes(b for m in trainer.model_parts for b in m.buffers())

    handles = [model.register_forward_hook(at_output)]

    def before_step(*a: Any) -> None:
        phase("backward")
        grads = _local_bytes(p.grad for p in params())
        resident["grads"] = max(resident.get("grads", 0), grads)

    def after_step(*a: Any) -> None:
        phase("step")
        ends.append(time.perf_counter())
        resident["params"] = _local_bytes(params())
        resident["optimizer"] = _local_bytes(_state_tensors(trainer.optimizers))

    handles.append(opts[0].register_step_pre_hook(before_step))
    handles.append(opts[-1].register_step_post_hook(after_step))
    return handles


def _gloo_sum_reductions(trainer: Any) -> None:
    """torchtitan sets FSDP2's gradient divide factor to 1.0 (distributed/fsdp.py:27-41, called at
    :316) and divides by the global token count itself; torch 2.13.0's FSDP2 then reduce-scatters
    with ReduceOp.PREMUL_SUM(1.0) (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:850),
    which gloo cannot run. `set_force_sum_reduction_for_comms(True)` (an FSDPModule method)
    makes it ReduceOp.SUM: the same sums, on the same buffers."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return
    from torch.distributed.fsdp import FSDPModule

    for part in trainer.model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)


def measure_length(
    config: dict[str, Any], setup: dict[str, Any], seq: int, steps: int, counter: Any
) -> dict[str, Any]:
    """Build torchtitan's Trainer for this length and run its `train()` for `steps` steps:
    this rank's peak (c10 CPU bytes alive above what was alive before the Trainer was built,
    maximised from the first step on), the bytes at the first step's start and the largest in
    each phase (`trace`), and the resident bytes of the local weight shards, gradients and
    optimizer states (`resident`). `counter`: an installed probe.cpu_memory counter."""
    from torchtitan.trainer import Trainer

    from probe.collective_settle import settled_collectives

    cfg = _trainer_config(config, setup, seq, steps)
    resident: dict[str, int] = {}
    ends: list[float] = []
    trace: dict[str, int] = {}
    marked: dict[str, int] = {}  # the same, only blocks the training thread allocated
    others: dict[str, int] = {}  # the most bytes gloo's worker threads allocated alive at once
    gc.collect()
    base = counter.current()
    base_other = counter.other_current()

    def phase(name: str) -> None:
        marked[name] = max(marked.get(name, 0), counter.marked_peak() - (base - base_other))
        others[name] = max(others.get(name, 0), counter.other_peak() - base_other)
        trace[name] = max(trace.get(name, 0), counter.reset_peak() - base)

    with settled_collectives() as settle:
        trainer = Trainer(cfg)
        _gloo_sum_reductions(trainer)
        handles = _hook_phases(trainer, resident, ends, phase, lambda: counter.current() - base)
        # global element counts (a DTensor's numel is the whole parameter's)
        params_total = sum(p.numel() for m in trainer.model_parts for p in m.parameters())
        gc.collect()
        trace["at_window_start"] = counter.current() - base
        counter.reset_peak()  # the window starts with the first step
        started = time.perf_counter()
        trainer.train()
        phase("after_steps")
        for h in handles:
            h.remove()
        trace["at_end"] = counter.current() - base
        trainer.close()
        del trainer
        gc.collect()
    result = length_result(seq, params_total, int(base), trace, resident, [started, *ends])
    result["settle"] = settle.as_dict()
    result["trace_marked"] = marked
    result["trace_other_threads"] = others
    return result


def length_result(
    seq: int,
    params_total: float,
    base: int,
    trace: dict[str, int],
    resident: dict[str, int],
    times: list[float],
) -> dict[str, Any]:
    """One length's result, from either path (the gloo run here, the fake trace in
    `torchtitan_fake`): the peak is the largest phase of the trace, leaving out the window's
    start and end marks; `times` the window's start, then each step's end."""
    peak = max(v for k, v in trace.items() if k not in ("at_window_start", "at_end"))
    return {
        "seq_len": seq,
        "params_total": int(params_total),
        "peak_bytes": int(peak),
        "base_bytes": base,
        "trace": trace,
        "resident": resident,
        "step_seconds": [b - a for a, b in zip(times, times[1:], strict=False)],
    }


def _environment(
    world: int, substituted: list[str], setup: dict[str, Any], device: str = "cpu"
) -> dict[str, Any]:
    env = describe_environment(device, gpu_count=world)
    env["memory_counter"] = "cpu_allocator_counter (probe/cpu_memory.py)"
    if device == "fake":
        from probe.torchtitan_fake import fake_environment

        env.update(fake_environment(world))
    env["attention_kernel"] = "sdpa (torchtitan ScaledDotProductAttention, CPU flash kernel)"
    versions = {name: package_version(name) for name in LIBRARIES}
    ac = {"none": "no", "gpu": "FullAC", "selective": "SelectiveAC (per-op)"}[
        setup["checkpointing"]
    ]
    env.update(
        {
            "stack": "torchtitan",
            "libraries": versions,
            "ran": [
                f"torchtitan {versions['torchtitan']} Trainer.__init__: ParallelDims and the "
                f"device mesh over {world} gloo rank(s), llama3 model built on meta and "
                "materialised by its init_weights, parallelize_llama (" + ac + " activation "
                "checkpointing, then FSDP2 fully_shard per TransformerBlock, tok_embeddings "
                "and [norm, lm_head] with MixedPrecisionPolicy(param_dtype="
                + ("float32" if setup["precision"] == "fp32" else "bfloat16")
                + ", reduce_dtype=float32)), OptimizersContainer (AdamW, "
                + (setup["optimizer_impl"] or "fused")
                + "), CrossEntropyLoss, LR scheduler",
                "torchtitan Trainer.train(): per step train_step (zero_grad, forward, loss, "
                "del pred, backward, clip_grad_norm_, optimizer and LR-scheduler step) with its "
                "garbage-collection schedule",
            ],
            "substituted": list(substituted),
        }
    )
    return env


def _fake_substituted() -> list[str]:
    """What stood in under `--device fake`: the CPU run's substitutions less the gloo and c10
    ones (the fake backend replaces gloo; the storage tracker the c10 counter), plus
    probe.torchtitan_fake.FAKE_SUBSTITUTED."""
    from probe.torchtitan_fake import FAKE_SUBSTITUTED

    gloo_or_c10 = ("FSDP2 reduce-scatter:", "collective release:", "memory:")
    gloo = "; torch.distributed then uses gloo (Backend.default_device_backend_map['cpu'])"
    kept = [s.replace(gloo, "") for s in SUBSTITUTED if not s.startswith(gloo_or_c10)]
    memory = (
        "memory: storages counted by probe.torchtitan_fake.ResizeTracker (the storage tracker "
        "plus FSDP2's storage resizes, rounded to 512 B) in place of the CUDA caching "
        "allocator's max_memory_allocated; one rank (rank 0) of the simulated ranks is traced"
    )
    return [*kept, *FAKE_SUBSTITUTED, memory]


def _result(
    seq: int, batch: int, measured: dict[str, Any] | None, error: str | None, device: str = "cpu"
) -> dict[str, Any]:
    from probe.results import new_result

    if measured is None:
        return new_result(seq, batch, "error" if error else "skipped", error or "not reached")
    res = new_result(seq, batch, "ok")
    seconds = [float(x) for x in measured["step_seconds"]]
    res["steps"] = len(seconds)
    res["step_seconds"] = seconds
    res["peak_allocated_bytes"] = measured["peak_bytes"]
    if seconds and device != "fake":  # fake steps take no real time
        res["tokens_per_second"] = seq * batch / (sum(seconds) / len(seconds))
    r = measured["resident"]
    fixed = r.get("params", 0) + r.get("grads", 0) + r.get("optimizer", 0)
    res["components"] = {
        "params": r.get("params", 0),
        "grads": r.get("grads", 0),
        "optimizer": r.get("optimizer", 0),
        # the rest of the peak: activations, logits, all-gathered parameters, collective buffers
        "activations": max(0, measured["peak_bytes"] - fixed),
    }
    return res


def run_torchtitan(
    config: dict[str, Any],
    setup: dict[str, Any],
    sweep: list[int] | str,
    steps: int = 2,
    device: str = "cpu",
    *,
    name: str | None = None,
    command: str | None = None,
    ranks: int = 1,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run torchtitan's Trainer per length on this rank (all ranks call it under torchrun) and
    return the memtest (rank 0's results, every rank's peaks in `ranks`) and every rank's raw
    measurements (peak, phase peaks, resident bytes) for the accuracy bench. `device="fake"`
    traces rank 0 of `ranks` simulated ranks in this process (probe/torchtitan_fake.py)."""
    import torch.distributed as dist

    from probe.config import check_config
    from probe.options import parse_sweep

    config = check_config(config)
    setup = torchtitan_setup(setup)
    lengths = parse_sweep(sweep)
    if not 1 <= steps <= 1000:
        raise ProbeInputError("steps", f"must be 1..1000 for --stack torchtitan, got {steps}")
    check_torchtitan_setup(setup, device)
    torchtitan_model_config(config)  # bad configs fail here, before any process group
    measured: list[dict[str, Any]] = []
    error: str | None = None
    if device == "fake":
        if not 1 <= ranks <= 1_000_000:
            raise ProbeInputError("ranks", f"must be 1..1000000 for --device fake, got {ranks}")
        return _fake_memtest(config, setup, lengths, steps, ranks, name, command)
    if ranks != 1:
        raise ProbeInputError(
            "ranks", "only with --device fake; on the CPU the ranks are torchrun's processes"
        )
    from probe.cpu_memory import CpuAllocatorCounter, compiler_missing

    reason = compiler_missing()
    if reason:
        raise ProbeInputError("device", f"--stack torchtitan measures with {reason}")
    counter = CpuAllocatorCounter()
    counter.install()  # before the process group: every c10 CPU block from here on
    counter.mark_thread()  # the training thread; gloo's workers' own blocks are kept apart
    with _torchrun_env(), _torchtitan_on_cpu():
        world = int(os.environ["WORLD_SIZE"])
        substituted = list(SUBSTITUTED)
        try:
            for seq in lengths:
                measured.append(measure_length(config, setup, seq, steps, counter))
        except Exception as exc:  # noqa: BLE001 - recorded in the memtest, as the runner does
            error = f"{type(exc).__name__}: {exc}"
        gathered: list[Any] = [measured]
        if dist.is_initialized():
            if world > 1:
                gathered = [None] * world
                dist.all_gather_object(gathered, measured)
            dist.destroy_process_group()
    doc = _memtest(
        config, setup, lengths, world, measured, error, gathered, substituted, name, command
    )
    raw = [{"rank": r, **m} for r, per_rank in enumerate(gathered) for m in per_rank]
    return doc, raw


def _fake_memtest(
    config: dict[str, Any],
    setup: dict[str, Any],
    lengths: list[int],
    steps: int,
    world: int,
    name: str | None,
    command: str | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`--device fake`: each length traced by probe.torchtitan_fake.trace_length."""
    from probe.torchtitan_fake import trace_length

    measured: list[dict[str, Any]] = []
    error: str | None = None
    try:
        for seq in lengths:
            measured.append(trace_length(config, setup, seq, steps, world, fake=True))
    except Exception as exc:  # noqa: BLE001 - recorded in the memtest, as the runner does
        error = f"{type(exc).__name__}: {exc}"
    doc = _memtest(
        config, setup, lengths, world, measured, error, [measured], _fake_substituted(),
        name, command, device="fake",
    )  # fmt: skip
    return doc, [{"rank": 0, **m} for m in measured]


def _memtest(
    config: dict[str, Any],
    setup: dict[str, Any],
    lengths: list[int],
    world: int,
    measured: list[dict[str, Any]],
    error: str | None,
    gathered: list[Any],
    substituted: list[str],
    name: str | None,
    command: str | None,
    device: str = "cpu",
) -> dict[str, Any]:
    setup = {
        **setup,
        "optimizer_impl": setup["optimizer_impl"] or "fused",
        "autocast": False,
        "sharding": "fsdp",
        "num_gpus": world,
        "parallel": f"fsdp={world}",
        "fsdp_wrap": "layer+embeddings+norm_lm_head",
        "reshard_after_forward": True,
        "compile": False,
    }
    by_seq = {m["seq_len"]: m for m in measured}
    params = int(measured[0]["params_total"]) if measured else 0
    results = []
    for seq in lengths:
        m = by_seq.get(seq)
        results.append(_result(seq, setup["batch"], m, None if m else error, device))
        if m is None and error is not None:
            error = None  # the first length not measured carries the error, the rest skipped
    ranks = [
        {
            "rank": r,
            "seq_len": m["seq_len"],
            "peak_allocated_bytes": m["peak_bytes"],
            "peak_reserved_bytes": None,
        }
        for r, per_rank in enumerate(gathered)
        for m in per_rank
    ]
    notes = [
        "components: params, grads and optimizer are this rank's resident local shards measured "
        "from the tensors after the optimizer step (grads before it); activations is the rest "
        "of the peak (activations, logits, all-gathered parameters, collective buffers)",
        "torchtitan's FSDP2 wrapping keeps [norm, lm_head] gathered after forward "
        "(reshard_after_forward only for the blocks and embeddings, distributed/fsdp.py)",
    ]
    doc = {
        "schema": SCHEMA_ID,
        "created_at": _now(),
        "tool": {
            "name": "trainfit-probe",
            "version": __version__,
            "command": command or f"probe.torchtitan_stack.run_torchtitan(sweep={lengths})",
        },
        "environment": _environment(world, substituted, setup, device),
        "model": {
            "name": name or str(config.get("_name_or_path") or "llama"),
            "model_type": str(config["model_type"]),
            "config": config,
            "params_total": params,
            "params_trainable": params,
        },
        "setup": setup,
        "sweep": lengths,
        "results": results,
        "ranks": ranks,
        "notes": notes,
    }
    settled = [m for m in measured if "settle" in m]
    if settled:
        notes.append(
            "collective release (probe/collective_settle.py), this rank, per length: "
            + "; ".join(
                f"{m['seq_len']}: {m['settle']['ops']} synchronous collectives, "
                f"{m['settle']['late']} held by gloo's worker on return "
                f"({m['settle']['wait_us']:.0f} us waited, {m['settle']['timeouts']} timeouts), "
                f"{m['settle']['async_ops']} asynchronous"
                for m in settled
            )
        )
    if device == "fake":
        notes.append(
            f"fake trace: rank 0 of {world} ranks simulated by torchtitan's fake_backend; "
            "build and step seconds per length: "
            + ", ".join(
                f"{m['seq_len']}: {m['seconds']['build']:.1f} + {m['seconds']['steps']:.1f}"
                for m in measured
            )
        )
    return validate_memtest(doc)
