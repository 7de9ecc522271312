"""`evaluation`: the evaluation pass a run makes between training steps (`setup.eval_batch`
rows per device, at the training length), a moment of its own next to the step's.

When it runs: transformers' Trainer evaluates from `_maybe_log_save_evaluate`, after
`optimizer.step()` and `model.zero_grad()` (transformers 5.25.0 trainer.py, the inner training
loop), torchtune's recipes after the step as well (`validate`, full_finetune_distributed.py
bd2a0fc7 :873-900, the step's `zero_grad(set_to_none=True)` before it). So the weights and the
optimizer states are resident and the gradients are not (set_to_none frees them; accumulated
gradients are gone after the sync step).

What it holds: the forward runs under `torch.no_grad()` (Trainer `prediction_step`;
torchtune :881), so no activation is saved; the most alive is the larger of
- the loss, with the model's last hidden states (`tokens x hidden` in the stream's dtype):
  `full` and `liger`: transformers' `ForCausalLMLoss` over every logit, forward only (logits,
  their fp32 copy, the fp32 log-softmax: `loss_forward_bytes_per_logit`). Liger's fused loss
  skips the logits in training only (liger-kernel ead96b61 transformers/model/llama.py:113-136
  `skip_logits = self.training and labels is not None` when the caller passes none), and
  transformers' Trainer, axolotl's and LLaMA-Factory's pass none. TRL's SFTTrainer passes
  `skip_logits=True` in evaluation too unless metrics need the logits (trl f2cd5771
  sft_trainer.py:1718-1732: `compute_metrics` and `preprocess_logits_for_metrics` None, which
  the `trl sft` script leaves them), with `return_token_accuracy=True`
  (`setup.eval_skip_logits`): Liger's `LigerForCausalLMLoss` then pads and shifts the labels
  (two int64 copies per token, transformers/model/loss_utils.py:87-88) and its fused forward
  runs without gradients (ops/fused_linear_cross_entropy.py:54, 74-83: `input_requires_grad`
  is False under no_grad, so no weight gradient, but `grad_input = zeros_like(_input)` all
  the same, :72), holding one chunk's logits in the hidden states' dtype (:114, the chunk
  rule of training, :69, `loss_bytes`), an fp32 loss and an fp32 token accuracy per token
  (:86, :88) and the bool target mask (:92).
  `chunked` with the stack's `loss_num_chunks` (torchtune 0.6.1 CEWithChunkedOutputLoss):
  every chunk's logits in their dtype and one chunk's fp32 upcast and log-softmax
  (`chunked_output_loss_bytes`' forward without the saved log-softmax outputs).
  `chunked` otherwise (TRL's chunked_nll runs whenever labels are given, training or not,
  trl sft_trainer.py:270-330): one chunk's loss as in training, without the hidden states'
  gradient. A compiled loss is counted eager (an overestimate).
  `cce`: axolotl's Cut Cross-Entropy fork (axolotl-ai-cloud/ml-cross-entropy@5f0c7a7) runs
  its loss in eval mode too: `use_lce` is true whenever labels are given unless `train_only`
  (cut_cross_entropy/transformers/utils.py:87-94), which `cce_patch` defaults to False
  (transformers/patch.py:146-202) and axolotl does not pass (axolotl 067b021c
  integrations/cut_cross_entropy/__init__.py:107-110); the patched forward then makes no
  logits (transformers/llama.py:70-79, the pattern of every patched model). Its forward keeps
  an fp32 log-sum-exp and an fp32 target dot per token (cce.py:59-108, cce_lse_forward.py:196),
  the int64 targets (padded copy, cce.py:272-275) and the int32 valid indices (utils.py:35,
  made through nonzero's int64): at most 4 + 4 + 8 + 8 + 4 bytes per token; no gradient.
  `unsloth`: Unsloth's causal-LM forward calls its fused loss whenever labels are given, in
  eval mode too (unsloth 015bdef0d9 models/llama.py:1464-1514: no `self.training` test), and
  that autograd Function's forward allocates the hidden states' gradient and runs each chunk's
  compiled `grad_and_value` whatever the grad mode (unsloth_zoo ce232d6c
  fused_losses/cross_entropy_loss.py:176-258, 325-346): the training loss's own bytes
  (`memory.logits.loss_bytes`), at the evaluation's tokens.
- one decoder layer's forward (`layer_bytes_per_token`). A dense decoder layer of
  transformers' eager modules peaks in its MLP or its attention, whichever is larger:
  MLP (models/llama/modeling_llama.py LlamaMLP.forward, `down_proj(act_fn(gate_proj(x)) *
  up_proj(x))`, and LlamaDecoderLayer.forward, which keeps `residual` across it): at the
  product, the residual, the MLP's input, `act_fn(gate)`, `up` and their product (3 MLP-wide
  tensors; Liger's SwiGLU makes the product from gate and up in one kernel, the same three);
  a LoRA branch on gate_proj or up_proj adds lora_B's output and its scaled copy (peft 0.22.0
  tuners/lora/layer.py:1205 `result = result + lora_B(lora_A(dropout(x))) * scaling`;
  dropout is the identity in eval mode), in the adapter's dtype without autocast, with the
  input's cast copy (`_cast_input_dtype`).
  attention (LlamaAttention.forward): its input, q and apply_rotary_pos_emb's temporaries
  (q * cos, rotate_half(q), its product with sin), k and v; eager attention instead the rotated
  q and k, v, k and v repeated to the query heads (repeat_kv) and per score the scaled and
  masked scores in the compute dtype, their fp32 copy and softmax's fp32 output
  (`eager_attention_forward`: softmax(dtype=float32); for bf16 scores torch's softmax converts
  before the kernel, aten/src/ATen/native/SoftMax.cpp, only fp16 on CUDA has a fused path).
  Held besides: the decoder layer's input (its caller's reference) and `inputs_embeds`, which
  LlamaModel.forward keeps through the layer loop (torchtune's decoder reassigns it).
  Other layers (MoE, linear attention, MLA, GPT-2, Unsloth's fused and compiled layers):
  bounded by the worst layer's saved activations at these tokens (a no-grad forward makes
  them but frees each as its consumer runs: an upper bound). A quantized base adds its
  dequantized weight (`memory/dequant.py`).
Time is not priced: an evaluation's steps add to the run's hours."""

from __future__ import annotations

from typing import Any

from estimator import lazy_numpy as np
from estimator.dtypes import FP32, INT64
from estimator.errors import EstimatorInputError
from estimator.memory.activations import Context
from estimator.memory.logits import (
    LossRule,
    chunk_positions,
    loss_bytes,
    loss_forward_bytes_per_logit,
    trl_logprob_bytes,
)
from estimator.setup_rules import eval_loss_unmodelled
from estimator.spec import LAYER_FULL, LAYER_SLIDING, MLP_DENSE, ModelSpec

MLP_INPUTS = frozenset({"gate_proj", "up_proj"})


def eval_loss_bytes(
    rule: LossRule, tokens: Any, seq: Any, shape: tuple[int, int], dtypes: tuple[int, int]
) -> Any:
    """Bytes of the evaluation's loss at `tokens` (module docstring). `shape` = (vocab, hidden),
    `dtypes` = (logits, hidden states)."""
    vocab, hidden = shape
    logit_dtype, hidden_dtype = dtypes
    unmodelled = eval_loss_unmodelled(rule.loss)
    if unmodelled is not None:  # a searched variant the setup's rules did not see
        raise EstimatorInputError("setup.eval_batch", unmodelled)
    last_hidden = tokens * hidden * hidden_dtype
    if rule.loss == "liger" and rule.eval_skips_logits:
        # the fused forward's own bytes (grad_input, one chunk, fp32 loss) as in training, and
        # per token the fp32 accuracy, the padded and shifted int64 labels, the bool mask
        labels = tokens * (FP32 + 2 * INT64 + 1)
        return loss_bytes(rule, tokens, seq, shape, dtypes) + labels + last_hidden
    if rule.loss in ("full", "liger"):
        per_logit = loss_forward_bytes_per_logit(logit_dtype, hold_output=False)
        return tokens * vocab * per_logit + last_hidden
    if rule.loss == "unsloth":
        return loss_bytes(rule, tokens, seq, shape, dtypes) + last_hidden
    if rule.loss == "cce":  # no logits; per token: lse, target dot, targets, valid indices
        return tokens * (2 * FP32 + 8 + 8 + 4) + last_hidden
    if rule.fixed_chunked:  # a profile's hand rule for the chunked loss (seed 000)
        return tokens * 0.0 + rule.fixed_chunked + last_hidden
    if rule.vocab_tile:  # TRL's fused head without grad, beside the last hidden states its
        # copy of them (`hidden_states[mask]`, as large bar one position per row)
        held = trl_logprob_bytes(rule, tokens, seq, shape, dtypes, forward_only=True)
        return held + 2 * last_hidden
    chunk = chunk_positions(rule, tokens, seq)
    if rule.num_chunks:
        upcast = 0 if logit_dtype == FP32 else FP32
        return tokens * vocab * logit_dtype + chunk * vocab * (upcast + FP32) + last_hidden
    head = FP32 * vocab * hidden if rule.upcasts_head else 0
    return chunk * vocab * rule.per_logit + head + last_hidden


def eval_parts(resident: dict[str, Any], loss: Any, layer: Any) -> dict[str, Any]:
    """The evaluation moment by part: what stays resident (`resident`: weights, states without
    gradients, ...) and the larger of its loss and one layer's forward (`evaluation`)."""
    return {**resident, "evaluation": np.maximum(loss, layer)}


def layer_bytes_per_token(ctx: Context, spec: ModelSpec, seq: Any) -> Any | None:
    """A dense decoder layer's no-grad forward, bytes per token at `seq` positions per row
    (module docstring); None where it is not modelled (the caller bounds it)."""
    h, m = spec.hidden or 0, spec.intermediate or 0
    heads, kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    dense = set(spec.mlp_types) <= {MLP_DENSE} and set(spec.layer_types) <= {
        LAYER_FULL,
        LAYER_SLIDING,
    }
    plain = not (ctx.fused or ctx.compiled or spec.mla or spec.model_type == "gpt2")
    if not (dense and plain and h and m and heads and kv_heads and head_dim):
        return None
    cb = ctx.compute_bytes
    stream = ctx.input_bytes or cb
    attn = ctx.attn_bytes or cb
    mlp = 3 * cb * m  # act_fn(gate), up, their product
    if not ctx.full and ctx.targets & MLP_INPUTS:
        lora = cb if ctx.autocast else ctx.adapter_bytes  # lora_B's output and its scaled copy
        mlp = max(mlp, 2 * cb * m + 2 * lora * m)  # with act_fn(gate) and the base's output
        if ctx.adapter_bytes != cb:
            mlp += ctx.adapter_bytes * h  # the input cast to the adapter's dtype
    q, kv = heads * head_dim, kv_heads * head_dim
    if ctx.eager:  # q and k rotated, v, k and v repeated to the query heads, the scores
        attention = attn * (3 * q + 2 * kv) + seq * heads * (attn + 2 * FP32)
    else:  # q, q * cos, rotate_half(q), its product with sin; k and v
        attention = seq * 0.0 + attn * (4 * q + 2 * kv)
    # the layer's input and the sublayer's input; the MLP's moment also the post-attention
    # residual; transformers' model keeps `inputs_embeds` through the loop (LlamaModel.forward),
    # torchtune's reassigns it (bd2a0fc7 modules/transformer.py:322-329)
    held = (2 if ctx.torchtune else 3) * stream * h
    return np.maximum(held + stream * h + mlp, held + attention)
