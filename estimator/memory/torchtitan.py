"""What torchtitan 0.3.0 (`--stack torchtitan`) does that the generic terms count otherwise.

Read from the torchtitan 0.3.0 wheel (PyPI) and torch 2.13.0; each function names its lines.
Checked op by op against fake traces of torchtitan's own Trainer (probe/torchtitan_fake.py,
which equal the CPU runs to the byte): bench/results/accuracy_torchtitan_2026-12-03b.md. Only
the `torchtitan` stack: `torchtitan-2024` (9dec370) had its own RMSNorm and one RoPE buffer;
of `fsdp_units` it gets what is torch's FSDP2 (the reduce-scatter's buffers, late gradients).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from estimator.dtypes import FP32
from estimator.parallel.data import DataParallelBytes, ReplicaBytes, shard_degree
from estimator.parallel.layout import Layout
from estimator.spec import LAYER_LINEAR, ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

STACK = "torchtitan"
# stacks whose FSDP2 reduce-scatter terms `fsdp_units` counts (the 2024 one: torch's part only)
FSDP2_REDUCE_STACKS = (STACK, "torchtitan-2024")
COMPLEX64 = 8  # bytes of one complex64 value


def applies(setup: TrainingSetup) -> bool:
    return setup.stack == STACK


def torch_rms_norm(setup: TrainingSetup) -> bool:
    """torchtitan's RMSNorm is `torch.nn.RMSNorm` (models/common/nn_modules.py:134-148), i.e.
    `torch.rms_norm`, which dispatches to `_fused_rms_norm` (torch 2.13 aten rms_norm_symint).
    On CUDA that is a fused kernel (native_functions.yaml:3254-3259 `CUDA:
    _fused_rms_norm_cuda`) whose backward is `_fused_rms_norm_backward(grad, input, ...,
    result1, weight)` (autograd/derivatives.yaml:1284-1285): it saves its input as it is (the
    compute dtype) and the fp32 rstd per row, no fp32 copy and no normalised tensor
    (`activations.rms_norm_saved`). On the CPU the same op is the CompositeImplicitAutograd
    `rms_norm_composite` (fp32 upcast, rsqrt, upcast * rsqrt * weight in fp32, cast back),
    which saves two fp32 copies per row of width: what the CPU referee measures, not a GPU."""
    return applies(setup)


def rope_cache_bytes(spec: ModelSpec, setup: TrainingSetup, seq: Any) -> Any:
    """RoPE caches on every device, unsharded (FSDP2 shards parameters, not buffers). Each
    attention layer builds its own RoPE module (models/common/attention.py `self.rope =
    config.rope.build()`), which registers a non-persistent buffer `cache` (models/common/
    rope.py:111-114), for llama3's ComplexRoPE a complex64 (max_seq_len, head_dim / 2) tensor
    (rope.py:185-234, `torch.polar`), and the Trainer sets every layer's RoPE max_seq_len to
    the training seq_len (models/common/decoder.py:175-181). 320 MiB for Llama 3.1 70B at
    8192 tokens (80 layers, head_dim 128)."""
    if not applies(setup) or not spec.head_dim:
        return seq * 0.0
    attention_layers = sum(1 for t in spec.layer_types if t != LAYER_LINEAR)
    return seq * attention_layers * (spec.head_dim // 2) * COMPLEX64


def fsdp_units(
    dp: DataParallelBytes, r: ReplicaBytes, layout: Layout, reduce_bytes: float,
    setup: TrainingSetup,
) -> DataParallelBytes:  # fmt: skip
    """FSDP2's reduce-scatter under torchtitan's units (`data.fsdp_bytes` counts the generic
    case), where the reduce dtype is the sharded gradient's (fp32: torchtitan's
    mixed_precision_reduce with fp32 sharded parameters):
    - each unit's post-backward reduce-scatters its gradients and makes the reduce output the
      sharded gradient itself (torch 2.13 fsdp/_fully_shard/_fsdp_collectives.py:696-731:
      `_to_dtype_if_needed` is a no-op for equal dtypes, `as_strided(reduce_output, ...)`
      becomes `sharded_param.grad`): the output is no buffer beside the gradients;
    - post_backward reshards the unit before it reduces (_fsdp_param_group.py:606-638), and the
      unsharded gradients are freed once copied into the reduce-scatter input
      (_fsdp_collectives.py:596-601 `unsharded_grads.clear()`), before the output is
      allocated: the copy-in holds gradients + input, the reduce input + output;
    - at one rank torch copies `reduce_scatter_input / gradient_divide_factor` into the output
      (_fsdp_collectives.py:625-629), a temporary of the input's size, because torchtitan sets
      the factor (distributed/fsdp.py:27-41 `set_gradient_divide_factor(1.0)`);
    - a gradient exists only once its unit is reduced: when the first decoder layer (the last
      unit of the backward) runs its backward, its own gradients and the embedding's (its unit
      is reduced last) are not made yet (`grads_late`);
    - the `[norm, lm_head]` unit kept unsharded after its forward (reshard_after_forward False,
      torchtitan distributed/fsdp.py:200-207) is resharded by its own post-backward
      (reshard_after_backward defaults to True, _fsdp_param_group.py:606-609), inside the loss
      phase: the decoder layers' backward does not hold it (`backward_extra`);
    - FSDP2 prefetches the next unit for backward in a unit's pre-backward, a hook on the
      module's outputs (_fsdp_state.py:381-392, :434-): torchtitan's model returns the logits
      and its loss runs outside the model (trainer.py `_forward_backward_body`), so that hook
      fires once the loss's backward has made the logits' gradient and freed its fp32 buffers:
      the loss moment holds no prefetched decoder unit (`forward_extra`). Only with 0.3.0's
      own head unit: `fsdp_wrap` with the lm_head in the root is torchtitan before
      pytorch/torchtitan#1094 (83e6941, 2025-07-28), which kept the last transformer block
      unsharded after its forward instead (torchtitan@e7c0cae
      torchtitan/models/llama3/parallelize_llama.py:349-357 `reshard_after_forward =
      int(layer_id) < len(model.layers) - 1`; #1094 moved that optimisation to the
      [norm, output] unit): one decoder unit at the loss, as the generic term counts.
    Other data-parallel kinds, pipelines and other reduce dtypes keep the generic terms.

    `torchtitan-2024` (9dec370 on torch 1963fc8, the 2.6 line) gets the torch FSDP2 parts only:
    the reduce output that is the sharded gradient and the freeing of the unsharded gradients
    before it is allocated (torch 2.6.0 _fsdp_collectives.py:371-383, :425-440, read by
    estimator/parallel/data.py), and `grads_late` (FSDP2 makes a unit's sharded gradient in
    its own post-backward). Not the divide's temporary (torch 2.6 divides the input in place,
    `_div_if_needed(reduce_scatter_input, predivide_factor)`; torchtitan@9dec370 sets no
    factor), nor the loss moment without a prefetched unit: torchtitan@9dec370
    parallelize_llama.py:333 keeps the last decoder block unsharded after its forward
    (`reshard_after_forward = int(layer_id) < len(model.layers) - 1`), which is the one unit
    the generic term counts at the loss; it has no separate head or embedding units."""
    titan03 = applies(setup)
    if setup.stack not in FSDP2_REDUCE_STACKS:
        return dp
    if layout.data != "fsdp" or layout.pp > 1 or not r.trainable:
        return dp
    n = shard_degree(layout)
    shard = dp.grads / r.trainable  # bytes of sharded gradient per parameter
    if abs(shard * n - reduce_bytes) > 1e-9:
        return dp
    gb, rb = r.grad_bytes, reduce_bytes
    temp = rb if n == 1 and titan03 else 0.0  # the divide's temporary at one rank
    unit = r.unit_trainable
    embed = 0.0
    if "embeddings" in layout.separate_units and not r.tied:
        embed = max(r.root_trainable - r.head_trainable, 0.0)
    head_kept = 0.0
    if (
        titan03
        and r.head_weights
        and (
            "norm_lm_head" in layout.separate_units
            or ("lm_head" in layout.separate_units and not layout.reshard_after_forward)
        )
    ):
        head_kept = r.head_weights  # data._separate_units `kept` of the head unit
    # 0.3.0's units reshard every block after its forward; with the head in the root unit
    # (`fsdp_wrap` without norm_lm_head / lm_head: torchtitan before #1094) the last block
    # was kept unsharded instead, the one unit the generic term counts at the loss
    head_unit = {"norm_lm_head", "lm_head"} & set(layout.separate_units)
    no_unit_at_loss = titan03 and layout.reshard_after_forward and bool(head_unit)
    out = dataclasses.replace(
        dp,
        backward_extra=dp.backward_extra - head_kept,
        forward_extra=dp.forward_extra - (r.unit_weights if no_unit_at_loss else 0.0),
        grads_late=(unit + embed) * shard,
        # after a layer unit's backward, its reduce: copy-in (gradients + input), then the
        # input, the divide's temporary and the output (the unit's sharded gradients)
        reduce_buffers=unit * max(gb + rb, rb + temp + shard),
    )
    if embed:
        embed_raf = layout.reshard_after_forward
        gathered = (r.root_weights - r.head_weights) / embed if embed_raf else 0.0
        # the embedding's backward (its gathered weight and unsharded gradient, no shard yet),
        # its copy-in (gradient + input), its reduce (input + temporary; the output is the
        # shard that `trainable_states` counts at this moment)
        generic = embed * (gathered + gb + rb * (1 + 1 / n))  # data._separate_units end_work
        now = embed * max(gathered + gb - shard, gb + rb - shard, rb + temp)
        out.end_extra = dp.end_extra - generic + now
    return out


# Set while the accuracy bench prices what a CPU referee measures (`cpu_referee`).
_CPU_REFEREE: ContextVar[bool] = ContextVar("torchtitan_cpu_referee", default=False)


@contextmanager
def cpu_referee(on: bool = True) -> Iterator[None]:
    """Within: the estimate prices what a CPU build of torch allocates, for comparing it with
    the probe's CPU steps (bench/accuracy_torchtitan.py, the CPU tests): no cuBLAS workspaces
    (memory/workspaces.py), and torch.nn.RMSNorm as a CPU build runs it. A CPU build has no
    `_fused_rms_norm` kernel (native_functions.yaml:3254-3259: CUDA, MPS, XPU kernels and the
    CompositeImplicitAutograd `rms_norm_composite` for the rest), so autograd records the
    composite's ops: `input.to(fp32)` (the input itself when fp32), pow, mean, rsqrt,
    `upcast * rsqrt` and `* weight` in fp32, `.to(input dtype)`: the fp32 upcast and the fp32
    normalised tensor are saved, each width wide, and the rstd per row. Never on for an
    estimate of a GPU."""
    token = _CPU_REFEREE.set(on)
    try:
        yield
    finally:
        _CPU_REFEREE.reset(token)


def on_cpu_referee() -> bool:
    return _CPU_REFEREE.get()


def norm_saved_per_row(compute_bytes: int, width: int, rows: int) -> float:
    """Bytes per token `torch.nn.RMSNorm` keeps (`torch_rms_norm`): on CUDA its input in the
    compute dtype and the fp32 rstd per row; under `cpu_referee` the composite's two fp32
    tensors and the rstd."""
    if _CPU_REFEREE.get():
        return float(2 * FP32 * width + FP32 * rows)
    return float(compute_bytes * width + FP32 * rows)


def norm_input_reused(input_bytes: int, width: int) -> float:
    """Bytes per token of what `torch.nn.RMSNorm` saves that is its input itself: on CUDA the
    input (`_fused_rms_norm` saves `input`); on the CPU composite only an fp32 input, which
    `.to(fp32)` returns as is."""
    if _CPU_REFEREE.get():
        return float(FP32 * width) if input_bytes == FP32 else 0.0
    return float(input_bytes * width)


def add_rope_cache(
    phases: dict[str, dict[str, Any]], spec: ModelSpec, setup: TrainingSetup, seq: Any
) -> None:
    """Add `rope_cache_bytes` to every moment of `phases` as its own part (torchtitan only)."""
    if not applies(setup):
        return
    cache = rope_cache_bytes(spec, setup, seq)
    for parts in phases.values():
        zero = next(iter(parts.values())) * 0.0 if parts else 0.0
        parts["rope_cache"] = zero + cache


def selective_saved_fused_qkv(compute_bytes: int, spec: ModelSpec, keep_down: bool = True) -> float:
    """Bytes per token per dense layer torchtitan 0.3.0's per-op SAC keeps. Its llama3 layers
    fuse q, k and v into one `wqkv` Linear (models/llama3/__init__.py: every flavor builds
    with fuse_qkv=True; models/common/attention.py FusedQKVLinear), so a layer runs five
    mms, wqkv, wo, w1, w3, w2 (FeedForward `w2(silu(w1(x)) * w3(x))`), and the policy saves
    the odd ones (distributed/activation_checkpoint.py:258-274: a per-layer counter,
    PREFER_RECOMPUTE on every second mm/linear): wqkv's whole output (q + 2 kv), w1's and
    w2's, plus SDPA's output and logsumexp (torch 2.13 _functorch/partitioners.py:2971-2983
    compute_intensive_ops: `_scaled_dot_product_flash_attention` and the efficient kernel)
    and the layer's input (the checkpoint). Under `cpu_referee` SDPA is recomputed: the CPU
    kernel `_scaled_dot_product_flash_attention_for_cpu` is on neither list. `keep_down`
    False: compiled, w2's output is not kept (`activations.selective_saved`)."""
    cb = compute_bytes
    h, m = spec.hidden or 0, spec.intermediate or 0
    heads, hd = spec.num_heads or 0, spec.head_dim or 0
    q, kv = heads * hd, (spec.num_kv_heads or 0) * hd
    sdpa = 0.0 if _CPU_REFEREE.get() else float(cb * q + FP32 * heads)
    down = h if keep_down else 0
    return float(cb * (h + q + 2 * kv + m + down)) + sdpa
