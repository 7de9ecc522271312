"""Attention geometry the FLOP count needs beyond full and sliding-window layers: Llama 4's
chunked attention and MLA's unequal query/key and value head dimensions."""

from __future__ import annotations

from estimator.spec import ModelSpec


def chunked_pairs(seq_len: int, chunk: int | None, causal: bool = True) -> float:
    """Query-key pairs of one chunked-attention layer for one sequence: the sequence is cut into
    blocks of `chunk` tokens and each query sees only its own block (transformers v5
    `masking_utils.chunked_causal_mask_function`, Llama 4 `attention_chunk_size`). Causal: c^2/2
    per full block plus r^2/2 for the remainder r (the FlashAttention s^2/2 convention of
    `flops.attention_pairs`); non-causal: c^2 and r^2."""
    s = int(seq_len)
    c = s if chunk is None or chunk >= s else int(chunk)
    full, rest = divmod(s, c)
    square = float(full * c * c + rest * rest)
    return square / 2.0 if causal else square


def core_head_dims(spec: ModelSpec) -> int:
    """d_qk + d_v of the attention core's two matmuls (QK^T and PV); 2 * head_dim except for
    MLA (qk_nope + qk_rope, v_head_dim)."""
    return (spec.qk_head_dim or 0) + (spec.v_head_dim or 0)
