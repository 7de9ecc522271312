"""Bytes per element of the formats trainfit models."""

from __future__ import annotations

BF16 = 2
FP32 = 4
INT8 = 1
INT64 = 8  # torch.long: indices, labels

# NF4 with double quantization (Dettmers et al. 2023, QLoRA, section 3; bitsandbytes
# `quantize_4bit(blocksize=64, compress_statistics=True)`): 4 bits per weight, one absmax per
# 64 weights quantized to 8 bits, and one fp32 second-level constant per 256 first-level ones.
NF4_BLOCK = 64
NF4_DOUBLE_QUANT_BLOCK = 256


def nf4_bytes_per_param(double_quant: bool = True) -> float:
    """With double quant: 0.5 + 1/64 + 4/(64*256) = 0.515869... bytes per quantized weight.
    Without (transformers' BitsAndBytesConfig default, utils/quantization_config.py:450): one
    fp32 absmax per 64 weights, 0.5 + 4/64 = 0.5625 (bitsandbytes functional.quantize_4bit)."""
    if double_quant:
        return 0.5 + INT8 / NF4_BLOCK + FP32 / (NF4_BLOCK * NF4_DOUBLE_QUANT_BLOCK)
    return 0.5 + FP32 / NF4_BLOCK


def int8_bytes_per_param(in_features: int) -> float:
    """LLM.int8 (Dettmers et al. 2022; bitsandbytes 0.50.2 nn/modules.py:719-746 Int8Params):
    int8 weights CB plus one fp32 scale SCB per output row, 1 + 4/in_features bytes."""
    return INT8 + FP32 / max(in_features, 1)


def compute_bytes(precision: str) -> int:
    """Activation / compute dtype: fp32 only when the whole run is fp32, else bf16."""
    return FP32 if precision == "fp32" else BF16
