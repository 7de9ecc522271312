"""Memory components, one behaviour each."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.dtypes import compute_bytes, nf4_bytes_per_param
from estimator.memory import memory_breakdown
from estimator.memory.activations import Context, head_input_saved, stream_bytes
from estimator.memory.logits import loss_bytes_per_logit
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")


def _mem(setup: TrainingSetup, seq: int = 4096, batch: int = 1, devices: int | None = None):
    return memory_breakdown(LLAMA8B, setup, [seq], batch, DEFAULT, devices=devices)


def test_offloaded_checkpoints_leave_one_layer_on_the_gpu_and_the_rest_on_the_host() -> None:
    # bf16 weights: under the hf stack's AMP `mixed` the residual stream is fp32 (test_stacks.py)
    gpu = _mem(TrainingSetup(precision="bf16", checkpointing="gpu"))
    off = _mem(TrainingSetup(precision="bf16", checkpointing="offload"))
    per_layer = 4096 * LLAMA8B.hidden * 2
    rope = 2 * 4096 * 128 * 2  # rope's cos and sin, made once per forward, stay on the GPU
    assert float(gpu.components["checkpoints"][0]) == per_layer * LLAMA8B.layers + rope
    assert float(off.components["checkpoints"][0]) == per_layer + rope
    assert float(off.host[0]) == per_layer * LLAMA8B.layers


def test_mixed_precision_adamw_is_16_bytes_per_parameter() -> None:
    mem = _mem(TrainingSetup(method="full", optimizer="adamw", precision="mixed"))
    total = float(mem.components["weights"][0] + mem.components["trainable_states"][0])
    # + fused AdamW's `step` tensor per parameter on the device (torch/optim/adam.py:168-176):
    # 291 tensors in Llama 3.1 8B, one 512-byte block each
    assert total == 16 * LLAMA8B.params_total + 512 * 291


def test_qlora_weights_use_nf4_with_double_quant_constants() -> None:
    # the probe stack: double quant on, no prepare_model_for_kbit_training (the hf stack's
    # BitsAndBytesConfig default is double_quant False: tests/estimator/test_stacks.py)
    mem = _mem(TrainingSetup(stack="probe", method="qlora", lora_targets=["all-linear"]))
    quantized = LLAMA8B.params_linear
    expected = quantized * nf4_bytes_per_param() + (LLAMA8B.params_total - quantized) * 2
    assert float(mem.components["weights"][0]) == pytest.approx(expected)
    assert nf4_bytes_per_param() == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))


def test_zero_stages_shard_progressively_more() -> None:
    base = TrainingSetup(method="full", num_gpus=8)
    peaks = [
        float(_mem(base.model_copy(update={"sharding": s})).peak[0])
        for s in ("zero1", "zero2", "zero3")
    ]
    assert peaks[0] > peaks[1] > peaks[2]


def test_fsdp_keeps_two_gathered_layers() -> None:
    mem = _mem(TrainingSetup(method="full", sharding="fsdp", num_gpus=8))
    shard = LLAMA8B.params_total * 2 / 8
    assert float(mem.components["weights"][0]) > shard


def test_loss_peak_is_twelve_bytes_per_logit_with_bf16_compute() -> None:
    assert loss_bytes_per_logit(2, hold_output=False) == 12
    assert loss_bytes_per_logit(2, hold_output=True) == 14
    assert loss_bytes_per_logit(4, hold_output=False) == 12


def test_chunked_loss_is_bounded_by_the_chunk() -> None:
    # the probe stack's chunked loss; bf16 weights: AMP's cast cache (test_stacks.py) would be
    # the larger moment at 8k
    setup = TrainingSetup(stack="probe", precision="bf16", loss="chunked", loss_chunk=1024)
    short = _mem(setup, seq=8192)
    long = _mem(setup, seq=65536)
    full = _mem(TrainingSetup(stack="probe", precision="bf16", loss="full"), seq=65536)
    vocab_part = 1024 * LLAMA8B.vocab * 12
    # per token: the hidden-state gradient (the probe stack leaves the head's inputs out)
    assert float(long.components["logits"][0]) - float(short.components["logits"][0]) == (
        pytest.approx((65536 - 8192) * LLAMA8B.hidden * 2)
    )
    assert float(long.components["logits"][0]) >= vocab_part
    assert float(full.components["logits"][0]) > 10 * float(long.components["logits"][0])


def test_trl_fused_head_holds_one_tile_whatever_the_length() -> None:
    """The hf stack's chunked loss, TRL 1.16.0's fused LM head: one (4096 x 32768) tile in the
    compute dtype at any length; per position its backward adds the int64 target, log_z,
    the entropy and the incoming gradient (fp32), the fp32 hidden-state gradient and its bf16
    cast, and per token the last norm's saved tensors and TRL's copy of the hidden states."""
    setup = TrainingSetup(precision="bf16", loss="chunked")
    assert setup.stack == "hf" and setup.loss_chunk == 4096
    short = _mem(setup, seq=8192)
    long = _mem(setup, seq=65536)
    full = _mem(TrainingSetup(precision="bf16", loss="full"), seq=65536)
    ctx = Context.build(LLAMA8B, setup, stream_bytes(setup, compute_bytes(setup.precision)))
    h = LLAMA8B.hidden
    per_token = 8 + 3 * 4 + h * (4 + 2) + head_input_saved(ctx, LLAMA8B, "chunked", 2)
    assert float(long.components["logits"][0]) - float(short.components["logits"][0]) == (
        pytest.approx((65536 - 8192) * per_token)
    )
    tile = 4096 * 32768 * 2
    # the tile and the trained head's fp32 gradient with its bf16 cast
    assert float(short.components["logits"][0]) > tile + LLAMA8B.vocab * h * (4 + 2)
    assert float(full.components["logits"][0]) > 10 * float(long.components["logits"][0])


def test_eager_attention_grows_quadratically_and_sdpa_does_not() -> None:
    def acts(attention: str, seq: int) -> float:
        return float(
            _mem(
                TrainingSetup(precision="bf16", checkpointing="none", attention=attention), seq=seq
            ).components["checkpoints"][0]
        )

    assert acts("sdpa", 8192) == pytest.approx(2 * acts("sdpa", 4096))
    assert acts("eager", 8192) > 3 * acts("eager", 4096)


def test_lora_saves_fp32_copies_of_adapted_inputs() -> None:
    # without autocast (probe stack); under HF's autocast both save bf16 copies (test_stacks.py)
    fp32 = _mem(
        TrainingSetup(stack="probe", method="lora", checkpointing="gpu", adapter_dtype="fp32")
    )
    bf16 = _mem(
        TrainingSetup(stack="probe", method="lora", checkpointing="gpu", adapter_dtype="bf16")
    )
    assert float(fp32.components["recompute_peak"][0]) > float(bf16.components["recompute_peak"][0])


def test_device_map_splits_weights_over_cards() -> None:
    one = _mem(TrainingSetup(method="lora"))
    two = _mem(TrainingSetup(method="lora"), devices=2)
    assert float(two.components["weights"][0]) == float(one.components["weights"][0]) / 2
    assert two.sharding == "device_map"


def test_params_only_spec_reports_what_it_cannot_compute() -> None:
    from estimator.spec import params_only_spec

    spec = params_only_spec(8e9, hidden=4096, layers=32)
    mem = memory_breakdown(spec, TrainingSetup(), [4096], 1, DEFAULT)
    assert mem.components["checkpoints"] is not None
    assert mem.components["logits"] is None and "logits" in mem.not_computable
    assert mem.peak_is_lower_bound
