"""torchao's 4-bit AdamW (`--optimizer adamw-4bit`; transformers' `adamw_torch_4bit`, 14 of
axolotl's example configs): two 4-bit moments and an fp32 scale per 128 values, full-width
moments for small tensors or sizes off the block (estimator/memory/states.py ADAM4BIT_*).
The golden tests build torchao's own state buffers (`AdamW4bit._new_buffer`, which its step
calls) for tensors shaped as the estimator's; they run where torchao is installed (`make test`
runs this file in .venv-torchtune too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.lora import lora_targets
from estimator.memory.states import (
    largest_tensor,
    qmap_bytes,
    trainable_state_bytes,
    unquantized_4bit_params,
)
from estimator.memory.weights import MIN_BLOCK
from estimator.presets import preset_config
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec
from estimator.train_config import read_train_config_text

CONFIGS = Path(__file__).parents[2] / "bench" / "configs"
SMALL_CONFIG = json.loads((CONFIGS / "small-llama.json").read_text())
SMALL = spec_from_config(SMALL_CONFIG)
# hidden 4160 = 32.5 blocks of 128: its norm weights (>= 4096 values) are off the block, which
# torchao leaves unquantized, as it does every tensor under 4096 values
OFF_BLOCK = spec_from_config({**SMALL_CONFIG, "hidden_size": 4160, "num_attention_heads": 32})
LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))


def _lora(rank: int) -> TrainingSetup:
    return TrainingSetup(
        method="lora", lora_rank=rank, lora_targets=["all-linear"], optimizer="adamw-4bit"
    )


def _full() -> TrainingSetup:
    return TrainingSetup(method="full", precision="bf16", optimizer="adamw-4bit")


def _shapes(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[int, ...]]:
    """The trained tensors' shapes: lora_A (r x in) and lora_B (out x r) per adapted Linear;
    under full fine-tuning every Linear weight, the norm weights and the embedding."""
    if setup.is_adapter:
        r = setup.lora_rank
        shapes: list[tuple[int, ...]] = []
        for t in lora_targets(spec, setup):
            shapes += [(r, t.in_features), (t.out_features, r)] * t.count
        return shapes
    shapes = [(lin.out_features, lin.in_features) for lin in spec.linears for _ in range(lin.count)]
    assert spec.hidden and spec.layers and not spec.qk_norm
    shapes += [(spec.hidden,)] * (spec.layers * spec.norms_per_layer + 1)
    return shapes + [(spec.vocab or 0, spec.hidden)]


def _torchao_state_bytes(shapes: list[tuple[int, ...]], dtype: Any) -> float:
    """Bytes of AdamW4bit's two moments per tensor, from the buffers torchao builds: a
    quantized moment's codes and scales as they are, its 16-value qmap as the allocator's
    512-byte block; an unquantized moment as torch.zeros_like(p)."""
    torch = pytest.importorskip("torch")
    optim = pytest.importorskip("torchao.optim")
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape in shapes]
    opt = optim.AdamW4bit(params)
    total = 0.0
    for p in params:
        for signed in (True, False):
            state = opt._new_buffer(p, signed)
            if hasattr(state, "codes"):
                assert state.codes.dtype == torch.uint8 and state.scale.dtype == torch.float32
                total += state.codes.nbytes + state.scale.nbytes
                total += -(-state.qmap.nbytes // MIN_BLOCK) * MIN_BLOCK
            else:
                assert state.dtype == p.dtype
                total += state.nbytes
    return total


@pytest.mark.parametrize("rank", [8, 16])
def test_adapter_states_are_torchaos_own_buffers(rank: int) -> None:
    """small-llama at r=8 has adapters under 4096 values (fp32 moments) and above (4-bit)."""
    torch = pytest.importorskip("torch")
    setup = _lora(rank)
    expected = _torchao_state_bytes(_shapes(SMALL, setup), torch.float32)
    assert trainable_state_bytes(SMALL, setup).optimizer == pytest.approx(expected)


@pytest.mark.parametrize("spec", [SMALL, OFF_BLOCK], ids=["small-llama", "hidden-4160"])
def test_full_fine_tuning_states_are_torchaos_own_buffers(spec: ModelSpec) -> None:
    torch = pytest.importorskip("torch")
    setup = _full()
    expected = _torchao_state_bytes(_shapes(spec, setup), torch.bfloat16)
    assert trainable_state_bytes(spec, setup).optimizer == pytest.approx(expected)


def test_norms_off_the_block_keep_full_width_moments() -> None:
    """The same model at hidden 4160: every norm weight (4160 values, not a multiple of 128)
    is unquantized; at hidden 256 they are too (under 4096); at 4096 (Llama 3.1 8B) none."""
    norms = sum(g.params for g in OFF_BLOCK.others if g.name == "norms")
    assert unquantized_4bit_params(OFF_BLOCK, _full()) == norms
    assert unquantized_4bit_params(LLAMA8B, _full()) == 0


def test_a_real_model_is_a_sixteenth_of_fp32_adamw_plus_scales() -> None:
    """Llama 3.1 8B, r=16: every adapter quantized: 2 x (0.5 + 4/128) bytes per parameter, and
    one 512-byte qmap block per moment of each adapter tensor."""
    setup = _lora(16)
    states = trainable_state_bytes(LLAMA8B, setup)
    tensors = 2 * sum(t.count for t in lora_targets(LLAMA8B, setup))
    assert qmap_bytes(LLAMA8B, setup) == 2 * tensors * MIN_BLOCK
    expected = states.trainable_params * 2 * (0.5 + 4 / 128) + 2 * tensors * MIN_BLOCK
    assert states.optimizer == pytest.approx(expected)
    adamw = trainable_state_bytes(LLAMA8B, setup.model_copy(update={"optimizer": "adamw"}))
    assert states.optimizer < adamw.optimizer / 7


def test_step_holds_no_tensor_sized_temporary_whatever_the_impl() -> None:
    """One compiled kernel per tensor (no foreach group buffer, no per-tensor copies: torchao's
    README benchmark, estimator/memory/states.py `step_transient_bytes`), under fused, foreach
    or in-backward alike; with fp32 masters the upcast gradient of the largest tensor, as for
    every optimizer stepping a master."""
    for impl in ("fused", "foreach", "in-backward"):
        setup = _full().model_copy(update={"optimizer_impl": impl})
        assert trainable_state_bytes(LLAMA8B, setup).step_transient == 0
    masters = _full().model_copy(update={"precision": "mixed", "stack": "probe"})
    transient = trainable_state_bytes(LLAMA8B, masters).step_transient
    assert transient == 4 * largest_tensor(LLAMA8B)
    assert trainable_state_bytes(LLAMA8B, _lora(16)).step_transient == 0


def test_torchaos_published_llama2_benchmark_differs_from_fused_adamw_by_the_states() -> None:
    """torchao's README (pytorch/ao 072500ab torchao/optim/README.md): Llama2-7B full BF16
    fine-tuning with torchtune on an A100, peak allocated 51.6 (fused AdamW), 39.3
    (bitsandbytes 8-bit) and 33.2 (ao 4-bit), torchtune's GiB. The estimate's differences
    from fused AdamW are the states' alone and within 0.1 GiB of the published ones."""
    llama2 = spec_from_config(
        {
            **SMALL_CONFIG,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32000,
        }
    )
    assert llama2.params_total == 6_738_415_616  # Llama-2-7b
    fused = TrainingSetup(method="full", precision="bf16", stack="torchtune")

    def saved(optimizer: str) -> float:
        a = trainable_state_bytes(llama2, fused)
        b = trainable_state_bytes(llama2, fused.model_copy(update={"optimizer": optimizer}))
        return (a.total + a.step_transient - b.total - b.step_transient) / 2**30

    assert saved("adamw-4bit") == pytest.approx(51.6 - 33.2, abs=0.1)
    assert saved("adamw-8bit") == pytest.approx(51.6 - 39.3, abs=0.1)  # bitsandbytes' row


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("axolotl", "base_model: x/y\nadapter: qlora\noptimizer: adamw_torch_4bit\n"),
        (
            "torchtune",
            "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
            "optimizer:\n  _component_: torchao.optim.AdamW4bit\n  lr: 2e-5\n",
        ),
        (
            "torchtune",
            "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
            "optimizer:\n  _component_: torchao.prototype.low_bit_optim.AdamW4bit\n",
        ),
    ],
)
def test_configs_naming_torchaos_4bit_adamw_are_read(fmt: str, text: str) -> None:
    mapping = read_train_config_text(text, fmt)
    assert (mapping.setup["optimizer"], mapping.setup["paged"]) == ("adamw-4bit", False)
    assert not {"optimizer", "optimizer._component_"} & {i.key for i in mapping.ignored}
