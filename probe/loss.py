"""The two losses of the setup: `full` (transformers' own) and `chunked`.

full: `model(input_ids, labels=input_ids).loss`, transformers' causal-LM loss: all logits at
once (batch x seq x vocab, in the compute dtype, upcast to fp32 inside the loss).

chunked: hidden states from the decoder, then per chunk of `loss_chunk` positions the LM head and
cross entropy, each chunk under non-reentrant checkpointing, so only one chunk's logits are alive
in the forward pass and one chunk's are recomputed at a time in the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["full_loss", "chunked_loss"]


def full_loss(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """transformers' loss from `labels`; the output is dropped before the caller's backward."""
    out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    loss: torch.Tensor = out.loss if hasattr(out, "loss") else out["loss"]
    del out  # as HF Trainer: holding the output would keep the logits alive through backward
    return loss


def _chunk_ce(lm_head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = lm_head(hidden).float()  # (b, chunk, vocab) fp32
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), reduction="sum")


def chunked_loss(
    decoder: nn.Module, lm_head: nn.Module, input_ids: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Mean next-token cross entropy, `chunk` positions at a time."""
    out = decoder(input_ids=input_ids, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    del out
    hidden = hidden[:, :-1]  # position t predicts token t+1
    labels = input_ids[:, 1:]
    total: torch.Tensor = hidden.new_zeros((), dtype=torch.float32)
    for h, y in zip(
        torch.split(hidden, chunk, dim=1), torch.split(labels, chunk, dim=1), strict=True
    ):
        total = total + checkpoint(_chunk_ce, lm_head, h, y, use_reentrant=False)
    return total / labels.numel()
