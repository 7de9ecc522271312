"""FSDP2's reduce-scatter stream pool in reserved bytes (estimator/memory/fragmentation.py (5),
estimator/parallel/data.py): the sharded gradients are made from that stream's blocks, which
the default stream's forward, loss and backward cannot use."""

from __future__ import annotations

from typing import Any

import pytest

import estimator.memory.sharded as sharded
from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.parallel.split import param_groups
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")
FSDP8 = dict(method="full", precision="mixed", checkpointing="gpu", num_gpus=8, parallel="fsdp")


def _mem(seq: int, **setup: Any) -> Any:
    s = TrainingSetup(**{**FSDP8, **setup})
    return memory_breakdown(LLAMA8B, s, [seq], 1, DEFAULT, devices=s.num_gpus)


def _largest_phase(mem: Any) -> str:
    totals = {name: float(sum(parts.values())[0]) for name, parts in mem.phases.items()}
    return max(totals, key=lambda name: totals[name])


def _without_pool(monkeypatch: pytest.MonkeyPatch, seq: int, **setup: Any) -> Any:
    """The same estimate with the stream-blind phases only (the estimator before the pool)."""
    with monkeypatch.context() as m:
        m.setattr(sharded, "counts_fragmentation", lambda *_: False)
        return _mem(seq, **setup)


def test_loss_phase_reserves_the_sharded_gradients_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan (fp32 reduce over fp32 sharded parameters): after zero_grad the sharded
    gradients' blocks stay cached for the reduce-scatter stream, so at a loss-phase peak
    reserved exceeds the stream-blind figure by exactly the sharded gradients' bytes, 4 B per
    parameter / 8 ranks."""
    grads = LLAMA8B.params_total * 4 / 8
    mem = _mem(8192, stack="torchtitan-2024")
    assert _largest_phase(mem) == "loss"
    assert mem.parallel["fsdp_reduce_stream_pool"] == pytest.approx(grads)
    blind = _without_pool(monkeypatch, 8192, stack="torchtitan-2024")
    assert float(mem.reserved[0] - blind.reserved[0]) == pytest.approx(grads)
    assert float(mem.allocated[0]) == float(blind.allocated[0])  # the allocated peak is not
    # the stack that counts no fragmentation (the estimator before stacks) gets no pool
    probe = _mem(8192, stack="probe")
    probe_blind = _without_pool(monkeypatch, 8192, stack="probe")
    assert float(probe.reserved[0]) == float(probe_blind.reserved[0])


@pytest.mark.parametrize(
    ("stack", "seq", "loss"),
    [("torchtitan-2024", s, None) for s in (256, 2048, 8192, 32768)]
    + [("hf", 8192, None), ("torchtitan-2024", 16384, "liger"), ("hf", 16384, "liger")],
)
def test_reserved_is_the_same_whether_grad_holds_the_blocks_or_the_stream(
    stack: str, seq: int, loss: str | None
) -> None:
    """With gradient accumulation the sharded gradients are alive (allocated) through every
    later forward and backward; without it they are None there, but their blocks are cached on
    the reduce-scatter stream: reserved is the same either way, while the allocated peak
    differs by them wherever the forward or loss is the peak. In the backward the gradients
    made do not reuse the freed checkpoints' blocks (another stream), so the same holds where
    the backward is the peak: with a fused linear cross-entropy (Liger) the loss is small and
    the backward sets reserved, where a loss-phase term alone left accumulation 1.8 GiB
    (torchtitan) / 1.3 GiB (hf) above no accumulation at 16k."""
    chosen = {"loss": loss} if loss else {}  # else the stack's own loss
    one = _mem(seq, stack=stack, **chosen)
    acc = _mem(seq, stack=stack, grad_accum=2, **chosen)
    assert float(one.reserved[0]) == pytest.approx(float(acc.reserved[0]))
    grads = LLAMA8B.params_total * 4 / 8
    if _largest_phase(one) == "loss":
        assert float(acc.allocated[0] - one.allocated[0]) == pytest.approx(grads)
    if loss == "liger" or stack == "hf":
        assert _largest_phase(one) == "backward"
        assert float(acc.allocated[0]) > float(one.allocated[0])


def test_accumulated_gradients_are_not_counted_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under gradient accumulation (and under a pipeline) the estimator already counts the
    sharded gradients in every phase: the pool takes them out of the default stream's bytes
    and counts them once, so reserved does not move (no reduce-dtype cast in torchtitan)."""
    acc = _mem(8192, stack="torchtitan-2024", grad_accum=2)
    blind = _without_pool(monkeypatch, 8192, stack="torchtitan-2024", grad_accum=2)
    assert float(acc.reserved[0]) == pytest.approx(float(blind.reserved[0]))


def test_pipeline_ranks_keep_their_gradients_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pp = dict(stack="torchtitan-2024", num_gpus=16, parallel="fsdp=8,pp=2", grad_accum=None)
    mem = _mem(8192, **pp)
    blind = _without_pool(monkeypatch, 8192, **pp)
    assert mem.parallel["fsdp_reduce_stream_pool"] > 0
    assert float(mem.reserved[0]) == pytest.approx(float(blind.reserved[0]))


def test_a_bf16_reduce_of_fp32_shards_also_keeps_its_outputs_blocks_on_the_stream() -> None:
    """accelerate's FSDP2 reduces in bf16 (REDUCE_DTYPE_BYTES) over fp32 sharded parameters:
    foreach_reduce casts each unit's bf16 output to fp32 on the same stream (torch 2.13
    _fsdp_collectives.py:696) and frees the bf16 one, whose block serves the next layer's
    output; the root (embedding + lm_head), reduced last, is larger and needs a block of its
    own. So the stream holds the fp32 gradients plus one layer's and the root's bf16 outputs,
    and reserved is that much above what the stream-blind accumulating setup allocates."""
    embed, head, _, _ = param_groups(LLAMA8B)
    layer = (LLAMA8B.params_total - embed - head) / LLAMA8B.layers
    blocks = (layer + embed + head) / 8 * 2
    grads = LLAMA8B.params_total * 4 / 8
    mem = _mem(8192, stack="hf")
    assert mem.parallel["fsdp_reduce_stream_pool"] == pytest.approx(grads + blocks)
    acc = _mem(8192, stack="hf", grad_accum=2)
    # the accumulating setup counts the gradients allocated and the same pool: equal
    assert float(acc.reserved[0]) == pytest.approx(float(mem.reserved[0]))
    titan = _mem(8192, stack="torchtitan-2024")
    assert titan.parallel["fsdp_reduce_stream_pool"] == pytest.approx(grads)


def test_hsdp_keeps_every_groups_reduce_dtype_output_to_the_end_of_the_backward() -> None:
    """Under HSDP each group keeps its reduce-dtype output for the all-reduce until its next
    reduce or finalize_backward (torch 2.6.0 _fsdp_param_group.py:438-442, :462-467): with a
    bf16 reduce of fp32 shards all of them, the rank's gradients at 2 B, are alive at the
    end; with an fp32 reduce the output is the gradient itself."""
    grads = LLAMA8B.params_total * 4 / 4
    hf = _mem(8192, stack="hf", parallel="dp=2,fsdp=4")
    assert hf.parallel["fsdp_reduce_stream_pool"] == pytest.approx(grads * 1.5)
    titan = _mem(8192, stack="torchtitan-2024", parallel="dp=2,fsdp=4")
    assert titan.parallel["fsdp_reduce_stream_pool"] == pytest.approx(grads)


def test_cpu_offload_leaves_only_the_outputs_being_copied_on_the_stream() -> None:
    """CPUOffloadPolicy copies each new sharded gradient to the host (torch 2.13
    _fsdp_collectives.py:737-739) and drops the device one: the stream keeps no gradients,
    only the blocks of the outputs being copied, a layer's (reused layer after layer) and the
    larger root's, reduced last."""
    embed, head, _, _ = param_groups(LLAMA8B)
    layer = (LLAMA8B.params_total - embed - head) / LLAMA8B.layers
    mem = _mem(8192, stack="torchtitan-2024", offload="params")
    assert mem.parallel["fsdp_reduce_stream_pool"] == pytest.approx((layer + embed + head) / 8 * 4)


def test_ddp_and_zero_gradients_stay_on_the_default_stream() -> None:
    """DDP's and DeepSpeed's gradients are made on the default stream (no pool): there the
    freed gradients serve the next forward, and accumulation still costs reserved bytes."""
    for parallel in ("dp", "zero2"):
        one = _mem(8192, stack="torchtitan-2024", parallel=parallel)
        acc = _mem(8192, stack="torchtitan-2024", parallel=parallel, grad_accum=2)
        assert "fsdp_reduce_stream_pool" not in one.parallel
        assert float(acc.reserved[0]) > float(one.reserved[0])
