"""Saved activations of DeepSeek-V3's Multi-head Latent Attention (bytes per token), hooked
into `activations.layer_activations` for specs with `mla` geometry.

Tensors as transformers v5 `modeling_deepseek_v3.DeepseekV3Attention.forward` creates them
(h heads, q = q_lora_rank, c = kv_lora_rank, dn / dr / dv = nope / rope / value head dims):
- the layer input, consumed by q_a_proj and kv_a_proj_with_mqa;
- q_a_layernorm over q_a_proj's output (q wide) and its output, q_b_proj's input;
- kv_a_layernorm over the latent (c wide) and its output, kv_b_proj's input;
- rotary on q_rot / k_rot multiplies by the fixed cos/sin, which saves the small tables only;
- `torch.cat((q_pass, q_rot))` -> query (h * (dn + dr)); `expand_kv` -> a new key tensor
  (h * (dn + dr));
- SDPA/flash kernels: the value is a view of kv_b_proj's output, so the kernel's saved value
  keeps all of it alive (h * (dn + dv)); the output (h * dv) and an fp32 logsumexp per head.
  Not measured: on the CPU, SDPA with unequal q/k and v head dims takes the math path;
- eager (`eager_attention_forward`): q and k for QK^T, the fp32 softmax and its bf16 copy per key
  (s per head per token), and a contiguous copy of the value (h * dv) made by the PV matmul;
- o_proj's input (h * dv).
Eager: equal to the bytes torch's saved-tensor hooks see on a tiny DeepseekV3Attention
(tests/estimator/test_architectures_paths.py).
"""

from __future__ import annotations

from estimator.dtypes import FP32
from estimator.memory.activations import Context, inputs_saved, rms_norm_saved
from estimator.spec import ModelSpec


def mla_attention(ctx: Context, spec: ModelSpec) -> tuple[float, float]:
    """(bytes per token, bytes per token per sequence position) of one MLA layer."""
    geo = spec.mla
    assert geo is not None and spec.num_heads and spec.hidden
    cb = ctx.compute_bytes
    h = spec.num_heads
    qk, dv = geo.qk_head_dim, geo.v_head_dim
    kv_b_out = h * (geo.qk_nope_head_dim + dv)
    saved = inputs_saved(ctx, ["q_a_proj", "q_proj", "kv_a_proj_with_mqa"], spec.hidden)
    if geo.q_lora_rank:
        saved += rms_norm_saved(ctx, geo.q_lora_rank)
        saved += inputs_saved(ctx, ["q_b_proj"], geo.q_lora_rank)
    saved += rms_norm_saved(ctx, geo.kv_lora_rank)
    saved += inputs_saved(ctx, ["kv_b_proj"], geo.kv_lora_rank)
    saved += cb * (h * qk + h * qk)  # query, key
    per_seq = 0.0
    if ctx.eager:
        saved += cb * h * dv  # the value, made contiguous for the PV matmul
        per_seq = h * (FP32 + cb)
    else:
        saved += cb * kv_b_out + cb * h * dv + FP32 * h  # value's base, output, logsumexp
    saved += inputs_saved(ctx, ["o_proj"], h * dv)
    return saved, per_seq
