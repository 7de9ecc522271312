"""`logits`: lm_head output, its fp32 upcast, log-softmax and their gradients."""

from __future__ import annotations

from typing import Any

from estimator.dtypes import FP32
from estimator.profile import Profile
from estimator.setup import TrainingSetup


def loss_bytes_per_logit(compute_bytes: int, hold_output: bool) -> int:
    """transformers `ForCausalLMLoss` (loss/loss_utils.py): `logits.float()` then
    `cross_entropy` = log_softmax (saves its fp32 output) + nll_loss.
    Forward peak: logits (compute dtype) + fp32 upcast + fp32 log-softmax output.
    Backward peak: saved log-softmax output + nll gradient + log-softmax input gradient, all
    fp32 = 12 bytes. The bf16 logits stay alive only if the caller holds the model output
    (HF Trainer drops it before backward). With fp32 compute the upcast is a no-op."""
    upcast = 0 if compute_bytes == FP32 else FP32
    forward = compute_bytes + upcast + FP32
    backward = 3 * FP32
    held = compute_bytes if hold_output else 0
    return max(forward, backward) + held


def logits_bytes(
    tokens: Any, vocab: int, hidden: int, setup: TrainingSetup, profile: Profile, compute_bytes: int
) -> Any:
    """Full loss: tokens x vocab x bytes-per-logit. Chunked loss (each chunk of `loss_chunk`
    tokens recomputed in the backward): one chunk's logits plus the gradient of the hidden
    states being accumulated (tokens x hidden, compute dtype).
    Profiles may replace either by the seed's hand rules (`logits_bytes_per_logit`,
    `chunked_logits_fixed_bytes`)."""
    import numpy as np

    fixed_per_logit = profile.get("memory", "logits_bytes_per_logit")
    per_logit = fixed_per_logit or loss_bytes_per_logit(
        compute_bytes, bool(profile.get("memory", "hold_model_output"))
    )
    if setup.loss == "full":
        return tokens * vocab * per_logit
    fixed_chunked = profile.get("memory", "chunked_logits_fixed_bytes")
    if fixed_chunked:
        return tokens * 0 + fixed_chunked
    chunk = np.minimum(tokens, setup.loss_chunk)
    return chunk * vocab * per_logit + tokens * hidden * compute_bytes
