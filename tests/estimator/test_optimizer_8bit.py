"""8-bit optimizer states per tensor: bitsandbytes keeps fp32 states for tensors of fewer than
`min_8bit_size` (4096) values (bitsandbytes 0.50.2 optim/optimizer.py:502-503), checked against
bitsandbytes itself on tensors shaped as the estimator's LoRA matrices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.architectures import spec_from_config
from estimator.lora import lora_params, lora_targets
from estimator.memory.states import MIN_8BIT_SIZE, small_tensor_params, trainable_state_bytes
from estimator.presets import preset_config
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec

CONFIGS = Path(__file__).parents[2] / "bench" / "configs"
SMALL = spec_from_config(json.loads((CONFIGS / "small-llama.json").read_text()))
LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
EIGHT_BIT = 2 * (1 + 4 / 256)  # two uint8 states + one fp32 absmax per 256 values, per value


def _lora(rank: int) -> TrainingSetup:
    return TrainingSetup(
        method="lora", lora_rank=rank, lora_targets=["all-linear"], optimizer="adamw-8bit"
    )


def test_lora_matrices_under_4096_values_get_two_fp32_states() -> None:
    """small-llama (hidden 256, kv 128, MLP 704), r=8: q/o A and B 2048 values each, k/v A
    2048 and B 1024, gate/up A 2048, down B 2048 are fp32; gate/up B and down A (704 x 8 =
    5632) are 8-bit."""
    setup = _lora(8)
    params = lora_params(SMALL, setup)
    small = 2 * (2 * 4096 + 2 * 3072 + 3 * 2048)  # two layers
    wide = 2 * 3 * 5632
    assert params == small + wide
    assert small_tensor_params(SMALL, setup) == small
    optimizer = trainable_state_bytes(SMALL, setup).optimizer
    assert optimizer == pytest.approx(small * 2 * 4 + wide * EIGHT_BIT)


def test_lora_matrices_of_a_real_model_stay_8bit() -> None:
    setup = _lora(16)  # 16 x 4096 and up
    params = lora_params(LLAMA8B, setup)
    assert small_tensor_params(LLAMA8B, setup) == 0
    assert trainable_state_bytes(LLAMA8B, setup).optimizer == pytest.approx(params * EIGHT_BIT)


def test_full_fine_tuning_keeps_narrow_norms_at_32bit() -> None:
    """Norm weights are hidden wide: under 4096 values on a 2048-wide model (TinyLlama), not on
    Llama 3.1 8B (4096); neither has biases or q/k norms."""
    setup = TrainingSetup(method="full", precision="bf16", optimizer="adamw-8bit")
    tiny = spec_from_config(preset_config("tinyllama-1.1b"))
    norms = sum(g.params for g in tiny.others if g.name == "norms")
    assert tiny.hidden and tiny.hidden < MIN_8BIT_SIZE
    assert small_tensor_params(tiny, setup) == norms
    assert small_tensor_params(LLAMA8B, setup) == 0


def _bnb_state_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Bytes of bitsandbytes AdamW8bit's per-tensor states (state1/2, absmax1/2; the shared
    quantization maps excluded) after one step on tensors shaped as the LoRA matrices."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    r = setup.lora_rank
    params = []
    for t in lora_targets(spec, setup):
        for shape in ((r, t.in_features), (t.out_features, r)):
            params += [torch.nn.Parameter(torch.zeros(shape)) for _ in range(t.count)]
    opt = bnb.optim.AdamW8bit(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    keys = ("state1", "state2", "absmax1", "absmax2")
    return sum(
        opt.state[p][k].numel() * opt.state[p][k].element_size()
        for p in params
        for k in keys
        if k in opt.state[p]
    )


@pytest.mark.parametrize("rank", [8, 32])
def test_adapter_states_match_bitsandbytes(rank: int) -> None:
    """r=8: all fp32; r=32: lora_A (32 x 256) and the MLP's lora_B (704 x 32) 8-bit, the k/v
    lora_B (128 x 32) still fp32. bitsandbytes rounds the absmax blocks up (ceil(n / 256))."""
    setup = _lora(rank)
    measured = _bnb_state_bytes(SMALL, setup)
    assert trainable_state_bytes(SMALL, setup).optimizer == pytest.approx(measured, rel=1e-3)
