"""`quantize_experts` (axolotl's `quantize_moe_experts`): a QLoRA base whose fused 3-D expert
banks bitsandbytes stores in NF4 too (its parametrization), dequantized by every MoE layer's
forward and kept for its backward. Before, trainfit had no such option: axolotl configs with it
were estimated with bf16 banks (Qwen3-30B-A3B: 55.6 GiB of weights instead of ~17), the key
only a warning."""

from __future__ import annotations

from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.dtypes import int8_bytes_per_param, nf4_bytes_per_param
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.train_config import read_train_config_text
from trainfit.cli import main

PROFILE = load_profile("default")
CONFIG = preset_config("qwen3-30b-a3b")
SPEC = spec_from_config(CONFIG)
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
SEQ = 4096


def _bank_elements() -> int:
    """One MoE layer's expert banks from config.json: gate_up (2 x moe_intermediate x hidden)
    and down (hidden x moe_intermediate), for every expert."""
    return int(CONFIG["num_experts"] * 3 * CONFIG["moe_intermediate_size"] * CONFIG["hidden_size"])


def _memory(
    checkpointing: str, quantize: bool, targets: list[str] | None = None, **base: str
) -> Any:
    """QLoRA, or `base` (method and base) as given."""
    setup = TrainingSetup(
        **{"method": "qlora", **base},
        lora_targets=targets or ATTENTION,
        checkpointing=checkpointing,
        quantize_experts=quantize,
    )
    return memory_breakdown(SPEC, setup, float(SEQ), 1, PROFILE)


def test_the_banks_are_counted_in_nf4() -> None:
    bf16, nf4 = _memory("gpu", False), _memory("gpu", True)
    elements = _bank_elements() * CONFIG["num_hidden_layers"]
    double = TrainingSetup(method="qlora").double_quant  # the hf stack's: False
    saved = elements * (2 - nf4_bytes_per_param(bool(double)))
    assert bf16.components["weights"] - nf4.components["weights"] == pytest.approx(saved, rel=1e-9)
    assert nf4.components["weights"] < 18 * 2**30 < 55 * 2**30 < bf16.components["weights"]


def test_the_recomputed_layer_keeps_its_dequantized_banks() -> None:
    bank = 2 * _bank_elements()  # dequantized to bf16, the dtype they were quantized from
    bf16, nf4 = _memory("gpu", False), _memory("gpu", True)
    extra = nf4.components["recompute_peak"] - bf16.components["recompute_peak"]
    assert extra == pytest.approx(bank, rel=1e-9)
    assert nf4.peak < bf16.peak  # the NF4 banks save far more than one layer's copy


def test_without_checkpointing_every_layer_keeps_them() -> None:
    bank = 2 * _bank_elements()
    bf16, nf4 = _memory("none", False), _memory("none", True)
    extra = nf4.components["checkpoints"] - bf16.components["checkpoints"]
    assert extra == pytest.approx(bank * CONFIG["num_hidden_layers"], rel=1e-9)
    # saved bf16 copies of every bank and the NF4 banks: more than the bf16 banks alone
    assert nf4.peak > bf16.peak


def test_adapted_banks_are_not_counted_twice() -> None:
    """Under all-linear peft wraps the banks (ParamWrapper): its merged bank is what the layer
    saves (already counted); the dequantized one is an input of that sum, not kept."""
    bf16 = _memory("gpu", False, ["all-linear"])
    nf4 = _memory("gpu", True, ["all-linear"])
    assert nf4.components["recompute_peak"] == bf16.components["recompute_peak"]


def test_the_default_is_the_stack_s() -> None:
    assert TrainingSetup(method="qlora").quantize_experts is False  # transformers 5 + bnb
    assert TrainingSetup(method="qlora", stack="probe").quantize_experts is True  # its legacy


@pytest.mark.parametrize(
    "setup",
    [
        {"method": "lora"},
        {"method": "full"},
        {"method": "qlora", "stack": "torchtune"},
        {"method": "lora", "base": "int8", "stack": "unsloth"},
    ],
)
def test_what_cannot_quantize_banks_is_refused_naming_the_field(
    setup: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["estimate", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--quantize-experts"]
    for key, value in setup.items():
        args += [f"--{key.replace('_', '-')}", value]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "quantize_experts" in err and "Traceback" not in err


def test_axolotl_s_quantize_moe_experts() -> None:
    base = "base_model: Qwen/Qwen3-30B-A3B\nadapter: qlora\nquantize_moe_experts: true\n"
    four = read_train_config_text(base + "load_in_4bit: true\n")
    assert four.setup["quantize_experts"] is True
    assert four.origin["quantize_experts"] == "quantize_moe_experts"
    assert not [w for w in four.warnings if w.startswith("quantize_moe_experts")]
    eight = read_train_config_text(base.replace("qlora", "lora") + "load_in_8bit: true\n")
    assert eight.setup["base"] == "int8" and eight.setup["quantize_experts"] is True
    assert eight.origin["quantize_experts"] == "quantize_moe_experts"
    bf16 = read_train_config_text(base.replace("qlora", "lora"))  # axolotl refuses this one
    assert "quantize_experts" not in bf16.setup
    assert "quantize_moe_experts" in {i.key for i in bf16.ignored}


@pytest.mark.parametrize("stack", ["probe", "hf"])
def test_a_dumped_setup_validates_again(stack: str) -> None:
    """Memtests and quotes store the resolved setup: its echo of the stack's value is valid."""
    for method in ("lora", "qlora", "full"):
        setup = TrainingSetup(stack=stack, method=method)
        assert TrainingSetup.model_validate(setup.model_dump()) == setup
    asked = TrainingSetup(method="qlora", quantize_experts=True)
    assert TrainingSetup.model_validate(asked.model_dump()) == asked


def test_axolotl_s_linearized_llama4_experts_are_quantized_under_qlora() -> None:
    """axolotl's examples/llama-4/scout-qlora-single-h100-flex.yaml: `llama4_linearized_experts`
    makes every expert an nn.Linear that bitsandbytes quantizes (NF4 banks); outside QLoRA the
    key is reported as ignored, never dropped silently."""
    base = "base_model: meta-llama/Llama-4-Scout-17B-16E\nllama4_linearized_experts: true\n"
    qlora = read_train_config_text(base + "adapter: qlora\nload_in_4bit: true\n")
    assert qlora.setup["quantize_experts"] is True
    assert qlora.origin["quantize_experts"] == "llama4_linearized_experts"
    lora = read_train_config_text(base + "adapter: lora\n")
    assert "quantize_experts" not in lora.setup
    assert "llama4_linearized_experts" in {i.key for i in lora.ignored}


def _int8(checkpointing: str, quantize: bool) -> Any:
    return _memory(checkpointing, quantize, method="lora", base="int8")


def test_int8_banks_are_one_byte_and_a_row_scale() -> None:
    """axolotl's `quantize_moe_experts` under `load_in_8bit` (monkeypatch/moe_quant.py:49-66):
    bitsandbytes' int8_vectorwise_quant of each bank reshaped to (-1, last dim): an int8
    element and an fp32 scale per row, checked against the library itself."""
    import bitsandbytes.functional as bnb_f
    import torch

    experts, rows, width = 4, 6, 8
    bank = torch.randn(experts, rows, width, dtype=torch.bfloat16)
    data, stats, _ = bnb_f.int8_vectorwise_quant(bank.reshape(-1, width).to(torch.float16))
    stored = data.numel() * data.element_size() + stats.numel() * stats.element_size()
    assert stored == bank.numel() * int8_bytes_per_param(width)

    bf16, int8 = _int8("gpu", False), _int8("gpu", True)
    hidden, inter = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"]
    per_layer = CONFIG["num_experts"] * (
        2 * inter * hidden * (2 - int8_bytes_per_param(hidden))  # gate_up: rows of `hidden`
        + hidden * inter * (2 - int8_bytes_per_param(inter))  # down: rows of `inter`
    )
    saved = per_layer * CONFIG["num_hidden_layers"]
    assert bf16.components["weights"] - int8.components["weights"] == pytest.approx(saved, rel=1e-9)


def test_int8_banks_dequantize_to_fp32_and_run_the_experts_in_fp32() -> None:
    """Bnb8bitParametrization returns `int8_vectorwise_dequant`, fp32 (checked on the library);
    transformers' grouped_mm casts the tokens to the weight's dtype, so the recomputed layer
    keeps the fp32 banks (twice the NF4 case's bf16 copy) and fp32 expert tensors."""
    import bitsandbytes.functional as bnb_f
    import torch

    data, stats, _ = bnb_f.int8_vectorwise_quant(torch.randn(6, 8, dtype=torch.float16))
    assert bnb_f.int8_vectorwise_dequant(data, stats).dtype == torch.float32

    bf16, int8 = _int8("gpu", False), _int8("gpu", True)
    extra = int8.components["recompute_peak"] - bf16.components["recompute_peak"]
    banks = 4 * _bank_elements()
    assert extra > banks  # the fp32 banks and the expert tensors widened from bf16
    nf4 = _memory("gpu", True)
    nf4_extra = (
        nf4.components["recompute_peak"] - _memory("gpu", False).components["recompute_peak"]
    )
    assert extra > 2 * nf4_extra
    # beyond the banks' copy: the expert tensors widened from bf16 to fp32
    assert extra - banks > 0.05 * bf16.components["recompute_peak"]


# axolotl 067b021c examples/glm47-flash/lora.yaml, the keys trainfit reads (datasets, logging and
# scheduler keys left out); its README: "LoRA, no target experts (1x48GB @ ~35GiB/GPU)"
GLM47_FLASH_8BIT_LORA = """base_model: zai-org/GLM-4.7-Flash
plugins:
  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin
load_in_8bit: true
quantize_moe_experts: true
adapter: lora
sequence_len: 2048
sample_packing: true
lora_r: 32
lora_alpha: 16
lora_dropout: 0
lora_target_modules: [q_proj, v_proj, k_proj, o_proj]
gradient_accumulation_steps: 4
micro_batch_size: 2
optimizer: adamw_torch_8bit
bf16: auto
gradient_checkpointing: true
attn_implementation: flash_attention_2
"""


@pytest.mark.parametrize(("quantize", "gib"), [(True, 33.8), (False, 56.9)])
def test_the_readme_s_glm_4_7_flash_8bit_lora_figures(
    quantize: bool, gib: float, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's figures for that example: GLM-4.7-Flash as transformers' Glm4MoeLiteConfig
    defaults it (the model's 30B-A3B shape), with and without quantize_moe_experts."""
    import json

    from transformers import Glm4MoeLiteConfig

    config = tmp_path / "glm-4.7-flash.json"
    config.write_text(json.dumps(Glm4MoeLiteConfig().to_dict()))
    text = GLM47_FLASH_8BIT_LORA
    if not quantize:
        text = text.replace("quantize_moe_experts: true\n", "")
    yaml = tmp_path / "lora.yaml"
    yaml.write_text(text)
    args = ["estimate", "--model", str(config), "--train-config", str(yaml), "--gpu", "l40s"]
    capsys.readouterr()
    assert main([*args, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["setup"]["base"] == "int8"
    assert document["setup"]["quantize_experts"] is quantize
    assert round(document["rows"][0]["peak_bytes"] / 2**30, 1) == gib
