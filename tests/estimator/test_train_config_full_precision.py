"""Full fine-tuning of a model loaded in bf16. axolotl under `bf16` loads the model in bf16
and its weights stay bf16 on one device, under DDP and under FSDP2 (axolotl's own
fsdp2_prepare_model has no fp32 upcast), so the run is trainfit's `bf16` precision (bf16
weights, gradients and optimizer states). FSDP1 (accelerate's prepare upcasts the flat
parameters) and DeepSpeed (fp32 master partitions) keep `mixed`. Before, every axolotl full
fine-tune was priced as `mixed`, which the hf stack on one device reads as fp32 weights under
AMP: twice the model states. TRL: `dtype` (ModelConfig) or `model_init_kwargs.dtype` bfloat16
loads bf16 (its default is float32)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.train_config import read_train_config_text
from trainfit.cli import main

BASE = "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 2048\nbf16: auto\n"
FSDP2 = "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
FSDP2_NESTED = "fsdp_config:\n  fsdp_version: 2\n  reshard_after_forward: true\n"
FSDP1 = "fsdp_config:\n  reshard_after_forward: true\n"  # axolotl's default version is 1


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("", "bf16"),
        (FSDP2, "bf16"),
        (FSDP2_NESTED, "bf16"),  # validation.py:882-887 reads it there too
        (FSDP1, "mixed"),
        ("deepspeed: deepspeed_configs/zero3_bf16.json\n", "mixed"),
        ("adapter: lora\n", "mixed"),  # the adapters' dtype, not the base's
    ],
)
def test_the_precision_of_a_full_fine_tune(extra: str, precision: str) -> None:
    mapping = read_train_config_text(BASE + extra)
    assert mapping.setup["precision"] == precision
    if precision == "bf16":
        assert "axolotl loads bf16 weights" in mapping.origin["precision"]


def test_without_bf16_nothing_changes() -> None:
    mapping = read_train_config_text("base_model: meta-llama/Llama-3.1-8B\nsequence_len: 2048\n")
    assert "precision" not in mapping.setup


@pytest.mark.parametrize(
    ("extra", "reported"),
    [
        ("", True),  # no attention named: axolotl's embeddings stay fp32
        ("attn_implementation: sdpa\n", True),
        ("attn_implementation: flash_attention_2\n", False),  # cast back to bf16
        ("flash_attention: true\n", False),
        ("plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n", False),
        (FSDP2, False),  # the fp32 pass runs only without FSDP
    ],
)
def test_fp32_embeddings_are_reported(extra: str, reported: bool) -> None:
    mapping = read_train_config_text(BASE + extra)
    ignored = {i.key: i.reason for i in mapping.ignored}
    assert ("bf16" in ignored) is reported
    if reported:
        assert "fp32" in ignored["bf16"] and "lm_head" in ignored["bf16"]


def _peak(tmp_path: Path, text: str, gpu: str, capsys: pytest.CaptureFixture[str]) -> Any:
    path = tmp_path / "train.yaml"
    path.write_text(text)
    capsys.readouterr()
    assert main(["estimate", "--train-config", str(path), "--gpu", gpu, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_model_states_are_bf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B, AdamW: bf16 weights (2 B), gradients (2 B) and two bf16 states (4 B) where
    `mixed` on one device was fp32 weights, gradients and states (16 B)."""
    text = BASE.replace("meta-llama/Llama-3.1-8B", "llama-3.1-8b") + "optimizer: adamw_torch\n"
    pure = _peak(tmp_path, text, "h200", capsys)
    mixed = _peak(
        tmp_path, text.replace("bf16: auto\n", "bf16: auto\ndeepspeed: x.json\n"), "h200", capsys
    )
    params = pure["model"]["params_total"]
    states = pure["rows"][0]["components"]["trainable_states"]
    weights = pure["rows"][0]["components"]["weights"]
    assert weights == pytest.approx(2 * params, rel=0.01)
    assert states == pytest.approx(6 * params, rel=0.01)  # gradients + two Adam states
    assert pure["rows"][0]["peak_bytes"] < 0.6 * mixed["rows"][0]["peak_bytes"]


# axolotl 067b021c examples/gpt-oss/gpt-oss-20b-fft-fsdp2.yaml, the keys trainfit reads; its
# README: "FFT SFT (8x48GB @ ~36GiB/GPU or 4x80GB @ ~46GiB/GPU)", from device_mem_reserved
GPT_OSS_FSDP2 = """base_model: openai/gpt-oss-20b
plugins:
  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin
sequence_len: 4096
sample_packing: true
gradient_accumulation_steps: 2
micro_batch_size: 1
optimizer: adamw_torch_8bit
bf16: true
attn_implementation: kernels-community/vllm-flash-attn3
gradient_checkpointing: true
activation_offloading: true
fsdp_version: 2
fsdp_config:
  offload_params: false
  state_dict_type: SHARDED_STATE_DICT
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
  transformer_layer_cls_to_wrap: GptOssDecoderLayer
  reshard_after_forward: true
"""


def test_gpt_oss_fsdp2_on_four_h100s_against_axolotl_s_readme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = GPT_OSS_FSDP2.replace("openai/gpt-oss-20b", "gpt-oss-20b")
    document = _peak(tmp_path, text, "4xh100-80gb", capsys)
    assert document["setup"]["precision"] == "bf16"
    reserved = document["rows"][0]["reserved_bytes"] / 2**30
    assert reserved == pytest.approx(46, rel=0.05)  # was 65.6 GiB with fp32 flat parameters


TRL = "model_name_or_path: meta-llama/Llama-3.1-8B\nmax_length: 2048\nbf16: true\n"


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("", "mixed"),  # TRL's own default: float32 (trl/trainer/utils.py create_model_from_path)
        ("dtype: bfloat16\n", "bf16"),  # ModelConfig, passed on by trl/scripts/sft.py
        ("model_init_kwargs:\n  dtype: bfloat16\n", "bf16"),
        ("model_init_kwargs:\n  torch_dtype: bfloat16\n", "bf16"),
        ("dtype: float32\n", "mixed"),  # AMP over fp32 weights: bf16 is set
        ("dtype: bfloat16\nuse_peft: true\n", "mixed"),  # an adapter: the base is frozen
        ("dtype: bfloat16\nfsdp: full_shard auto_wrap\n", "mixed"),  # accelerate upcasts
        ("dtype: bfloat16\ndeepspeed: ds.json\n", "mixed"),  # fp32 master partitions
    ],
)
def test_trl_s_load_dtype(extra: str, precision: str) -> None:
    mapping = read_train_config_text(TRL + extra)
    assert mapping.setup.get("precision") == precision


def test_trl_s_auto_dtype_is_reported() -> None:
    mapping = read_train_config_text(TRL + "model_init_kwargs:\n  dtype: auto\n")
    assert mapping.setup["precision"] == "mixed"
    ignored = {i.key: i.reason for i in mapping.ignored}
    assert "checkpoint's own dtype" in ignored["model_init_kwargs.dtype"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("dtype: bf16\n", "train_config.dtype"),  # TRL's create_model_from_path refuses it
        ("dtype: 16\n", "train_config.dtype"),
        ("model_init_kwargs:\n  dtype: [bfloat16]\n", "train_config.model_init_kwargs.dtype"),
        ("model_init_kwargs:\n  torch_dtype: bfloat17\n", "model_init_kwargs.torch_dtype"),
    ],
)
def test_a_load_dtype_trl_refuses_is_bad_input_naming_the_key(extra: str, key: str) -> None:
    """TRL raises ValueError for a `dtype` other than auto / bfloat16 / float16 / float32
    (trl@f2cd577 trl/trainer/utils.py:1144-1153) and transformers for a `torch_dtype` that
    names no torch dtype (5.25.0 modeling_utils.py `_get_dtype`): before, trainfit ignored the
    value silently and priced the default load."""
    from estimator.errors import EstimatorInputError

    with pytest.raises(EstimatorInputError) as raised:
        read_train_config_text(TRL + extra)
    assert key in raised.value.field and "expected one of" in raised.value.message


@pytest.mark.parametrize(
    ("extra", "precision"),
    [
        ("dtype: float16\n", "bf16"),  # bfloat16's bytes
        ("model_init_kwargs:\n  torch_dtype: float64\n", "mixed"),  # reported, below
        ("model_init_kwargs:\n  torch_dtype:\n    text_config: bfloat16\n", "mixed"),
    ],
)
def test_load_dtypes_trl_and_transformers_accept_are_read(
    extra: str, precision: str | None
) -> None:
    mapping = read_train_config_text(TRL + extra)
    assert mapping.setup.get("precision") == precision
    ignored = {i.key for i in mapping.ignored}
    assert ("model_init_kwargs.torch_dtype" in ignored) is ("float64" in extra)
